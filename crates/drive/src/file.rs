use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::{check_io, BlockDevice, SECTOR_BYTES};

/// A drive backed by a local block device or a regular file, opened with O_DIRECT so that
/// the host page cache neither hides device errors nor double-buffers data.
#[derive(Debug)]
pub struct FileDrive {
    file: File,
    path: PathBuf,
    name: String,
    size_bytes: u64,
    is_block_device: bool,
}

impl FileDrive {
    /// Opens `path` for reading and writing.
    ///
    /// Regular files on file systems without O_DIRECT support (tmpfs on older kernels) are
    /// opened buffered instead; [`BlockDevice::flush`] still makes them durable with fdatasync.
    pub fn open(path: &Path) -> io::Result<FileDrive> {
        let meta = std::fs::metadata(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "{}: cannot open drive: {e}; check the device path",
                    path.display()
                ),
            )
        })?;
        let is_block_device = meta.file_type().is_block_device();
        if !is_block_device && !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a block device or regular file", path.display()),
            ));
        }
        let open = |direct: bool| {
            let mut options = OpenOptions::new();
            options.read(true).write(true);
            if direct {
                options.custom_flags(libc::O_DIRECT);
            }
            options.open(path)
        };
        let file = match open(true) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && !is_block_device => open(false)?,
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{}: cannot open drive: {e}", path.display()),
                ))
            }
        };
        let size_bytes = if is_block_device {
            block_device_bytes(&file)?
        } else {
            meta.len()
        };
        let size_bytes = size_bytes - size_bytes % SECTOR_BYTES;
        Ok(FileDrive {
            file,
            path: path.to_path_buf(),
            name: path.display().to_string(),
            size_bytes,
            is_block_device,
        })
    }

    /// The path the drive was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when the drive is a block device rather than a regular file.
    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }
}

fn block_device_bytes(file: &File) -> io::Result<u64> {
    use std::os::unix::io::AsRawFd;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut bytes: u64 = 0;
    // SAFETY: the ioctl writes one u64 into `bytes`.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut bytes) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(bytes)
}

impl BlockDevice for FileDrive {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_io(self, buf, offset)?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: read at {offset}: {e}", self.name)))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_io(self, buf, offset)?;
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: write at {offset}: {e}", self.name)))
    }

    fn flush(&self) -> io::Result<()> {
        // O_DIRECT bypasses the page cache but not the drive's volatile cache nor, for a
        // regular file, the host file system's block mapping; fdatasync covers both.
        self.file
            .sync_data()
            .map_err(|e| io::Error::new(e.kind(), format!("{}: flush: {e}", self.name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AlignedBuf;

    #[test]
    fn write_read_roundtrip_and_alignment_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let drive = FileDrive::open(&path).unwrap();
        assert_eq!(drive.size_bytes(), 1 << 20);
        let data = AlignedBuf::from_slice(&[0xab; 8192]);
        drive.write_at(&data, 4096).unwrap();
        drive.flush().unwrap();
        let mut back = AlignedBuf::zeroed(8192);
        drive.read_at(&mut back, 4096).unwrap();
        assert_eq!(&back[..], &data[..]);
        let err = drive.read_at(&mut back, 100).unwrap_err();
        assert!(err.to_string().contains("unaligned"), "{err}");
        let err = drive.write_at(&data, (1 << 20) - 4096).unwrap_err();
        assert!(err.to_string().contains("past the end"), "{err}");
    }

    #[test]
    fn missing_device_is_named() {
        let err = FileDrive::open(Path::new("/nonexistent/tessera-drive")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/tessera-drive"),
            "{err}"
        );
    }
}
