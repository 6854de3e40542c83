//! The queue reader's view of its socket.
//!
//! PDU headers are read through a buffer, so a burst of small PDUs (completions, 4 KiB
//! reads) costs one system call. A large PDU's data must instead go from the socket
//! straight into the command's buffer: whatever the buffer took past the header is copied
//! twice. `std::io::BufReader` fills its whole buffer with every header read, so after the
//! header of a 256 KiB C2HData PDU it had taken up to 64 KiB of that PDU's data, a quarter
//! of the bytes copied twice. Here, once a PDU brought large data, the next header is read
//! with a small fill (PDUs come in runs of a kind: a large read's pieces, or many small
//! reads), and data reads that find the buffer empty bypass it.

use std::io::{self, Read};

/// Data of at least this many bytes is large: the next header is read on its own.
pub(crate) const LARGE_DATA_BYTES: usize = 64 << 10;
/// The fill after large data: the longest PDU header with its digest, and room to spare.
const HEADER_FILL_BYTES: usize = 512;

/// A socket read through a buffer of `capacity` bytes that large data bypasses.
pub(crate) struct Inbound<R> {
    inner: R,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    /// The last PDU carried large data (see the module comment).
    after_large: bool,
}

impl<R: Read> Inbound<R> {
    pub(crate) fn new(inner: R, capacity: usize) -> Inbound<R> {
        assert!(capacity >= HEADER_FILL_BYTES);
        Inbound {
            inner,
            buf: vec![0; capacity].into_boxed_slice(),
            pos: 0,
            end: 0,
            after_large: false,
        }
    }

    /// The PDU just read carried `data_bytes` of data.
    pub(crate) fn pdu_done(&mut self, data_bytes: usize) {
        self.after_large = data_bytes >= LARGE_DATA_BYTES;
    }
}

impl<R: Read> Read for Inbound<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.end {
            if out.len() >= self.buf.len().min(LARGE_DATA_BYTES) {
                return self.inner.read(out);
            }
            let fill = if self.after_large {
                HEADER_FILL_BYTES
            } else {
                self.buf.len()
            };
            self.end = self.inner.read(&mut self.buf[..fill])?;
            self.pos = 0;
        }
        let n = out.len().min(self.end - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that records the size of every read asked of it.
    struct Recording<'a> {
        bytes: &'a [u8],
        asked: Vec<usize>,
    }

    impl Read for Recording<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            self.asked.push(out.len());
            let n = out.len().min(self.bytes.len());
            out[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    fn read_exact<R: Read>(r: &mut Inbound<R>, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        r.read_exact(&mut v).unwrap();
        v
    }

    #[test]
    fn bytes_come_out_in_order_and_large_data_bypasses_the_buffer() {
        let stream: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut r = Inbound::new(
            Recording {
                bytes: &stream,
                asked: Vec::new(),
            },
            64 << 10,
        );
        let mut got = Vec::new();
        // Small PDUs: a header fill takes the full buffer.
        for _ in 0..10 {
            got.extend(read_exact(&mut r, 24));
            got.extend(read_exact(&mut r, 4096));
            r.pdu_done(4096);
        }
        assert_eq!(r.inner.asked[0], 64 << 10);
        // Large PDUs: after the first, each header takes a small fill and the data goes
        // straight from the source.
        for _ in 0..3 {
            got.extend(read_exact(&mut r, 24));
            got.extend(read_exact(&mut r, 256 << 10));
            r.pdu_done(256 << 10);
        }
        let asked = &r.inner.asked;
        let small_fills = asked.iter().filter(|&&n| n == HEADER_FILL_BYTES).count();
        assert_eq!(small_fills, 2, "{asked:?}");
        // Back to small PDUs: the header after the large data takes a small fill; once it
        // is used up, the buffer fills whole again.
        let fills = r.inner.asked.len();
        for _ in 0..30 {
            got.extend(read_exact(&mut r, 24));
            r.pdu_done(0);
        }
        assert_eq!(r.inner.asked[fills..], [HEADER_FILL_BYTES, 64 << 10]);
        assert_eq!(got, stream[..got.len()]);
    }
}
