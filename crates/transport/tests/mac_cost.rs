//! Measures what the frame MAC costs per MiB, and a loopback transfer of large messages,
//! for the architecture notes. Reports CPU time (the machine may be shared, so wall time
//! says little) and wall time; asserts only correctness, never a time.
//! `cargo test -p tessera-transport --test mac_cost -- --nocapture`

mod common;

use std::time::Instant;

use common::{accept_one, cluster_pair, TIMEOUT};
use serde::de::{Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use tessera_transport::wire::{FrameMac, FRAME_HEADER_BYTES};

const MIB: usize = 1 << 20;

fn cpu_seconds(clock: libc::clockid_t) -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec the call writes into.
    let rc = unsafe { libc::clock_gettime(clock, &mut now) };
    assert_eq!(rc, 0, "clock_gettime");
    now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
}

#[test]
fn mac_cost_per_mib() {
    let mac = FrameMac::new(&[3; 32]);
    let payload = vec![0x5au8; MIB];
    let header = [0u8; FRAME_HEADER_BYTES];
    let rounds = 256;
    let (wall, cpu) = (Instant::now(), cpu_seconds(libc::CLOCK_THREAD_CPUTIME_ID));
    let mut last = [0u8; 16];
    for sequence in 0..rounds {
        last = mac.tag(sequence, &header, &payload);
    }
    let cpu = cpu_seconds(libc::CLOCK_THREAD_CPUTIME_ID) - cpu;
    let wall = wall.elapsed().as_secs_f64();
    assert!(mac.verify(rounds - 1, &header, &payload, &last));
    println!(
        "frame MAC (HMAC-SHA256): {:.3} ms CPU per MiB ({:.0} MiB/s per core); wall {:.3} ms/MiB",
        cpu * 1000.0 / rounds as f64,
        rounds as f64 / cpu,
        wall * 1000.0 / rounds as f64
    );
}

/// Bytes serialised as one serde byte string (postcard: length + memcpy) rather than a
/// sequence of u8 (one call per byte): how bulk data should travel.
#[derive(Debug, PartialEq)]
struct Bulk(Vec<u8>);

impl Serialize for Bulk {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Bulk {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Bulk, D::Error> {
        struct BulkVisitor;
        impl Visitor<'_> for BulkVisitor {
            type Value = Bulk;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E>(self, bytes: &[u8]) -> Result<Bulk, E> {
                Ok(Bulk(bytes.to_vec()))
            }
        }
        deserializer.deserialize_bytes(BulkVisitor)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_throughput_of_large_messages() {
    let (server_identity, client_identity) = cluster_pair();
    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let mut client = tessera_transport::connect(&addr.to_string(), &client_identity, TIMEOUT)
        .await
        .unwrap();
    let mut server_side = accepted.await.unwrap().unwrap();
    let messages = 64;
    let receiver = tokio::spawn(async move {
        let mut bytes = 0;
        for _ in 0..messages {
            let blob: Bulk = server_side.recv().await.unwrap().unwrap();
            assert!(blob.0.iter().all(|b| *b == 0xc3));
            bytes += blob.0.len();
        }
        bytes
    });
    let blob = Bulk(vec![0xc3u8; 4 * MIB]);
    let (wall, cpu) = (Instant::now(), cpu_seconds(libc::CLOCK_PROCESS_CPUTIME_ID));
    for _ in 0..messages {
        client.send(&blob).await.unwrap();
    }
    let received = receiver.await.unwrap();
    let cpu = cpu_seconds(libc::CLOCK_PROCESS_CPUTIME_ID) - cpu;
    let wall = wall.elapsed().as_secs_f64();
    assert_eq!(received, messages * 4 * MIB);
    let mib = (received / MIB) as f64;
    println!(
        "loopback, {mib} MiB in 4 MiB messages: {:.2} ms CPU per MiB for both ends \
         (encode, MAC, TCP, verify, decode, check); wall {:.0} MiB/s",
        cpu * 1000.0 / mib,
        mib / wall
    );
}
