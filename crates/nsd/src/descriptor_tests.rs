use std::path::{Path, PathBuf};

use tessera_drive::{AlignedBuf, BlockDevice, FileDrive};

use super::*;

/// A sparse file of `bytes` bytes opened as a drive; the directory must outlive it.
fn drive(dir: &Path, bytes: u64) -> (FileDrive, PathBuf) {
    let path = dir.join("nsd0");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    (FileDrive::open(&path).unwrap(), path)
}

fn sample() -> NsdDescriptor {
    NsdDescriptor {
        id: NsdId([7; 16]),
        name: "de0704a01v1".into(),
        device_bytes: MIN_NSD_BYTES,
        created_unix: 1_700_000_000,
        cluster_id: [0x5a; 16],
    }
}

fn flip_bit(dev: &FileDrive, byte: usize) {
    let mut sector = AlignedBuf::zeroed(4096);
    dev.read_at(&mut sector, 0).unwrap();
    sector[byte] ^= 0x10;
    dev.write_at(&sector, 0).unwrap();
}

#[test]
fn free_device() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, _) = drive(dir.path(), MIN_NSD_BYTES);
    assert_eq!(read_descriptor(&dev).unwrap(), None);
    assert_eq!(probe_in_use(&dev).unwrap(), InUse::Free);
    check_device_size(&dev).unwrap();
}

#[test]
fn roundtrip_and_erase() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, path) = drive(dir.path(), MIN_NSD_BYTES);
    write_descriptor(&dev, &sample()).unwrap();
    drop(dev);
    // Reopen so the descriptor is read from the file, not from anything kept in memory.
    let dev = FileDrive::open(&path).unwrap();
    assert_eq!(read_descriptor(&dev).unwrap(), Some(sample()));
    assert_eq!(probe_in_use(&dev).unwrap(), InUse::Nsd(sample()));
    erase_descriptor(&dev).unwrap();
    assert_eq!(probe_in_use(&dev).unwrap(), InUse::Free);
}

#[test]
fn longest_name_roundtrips() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, _) = drive(dir.path(), MIN_NSD_BYTES);
    let d = NsdDescriptor {
        name: "n".repeat(255),
        ..sample()
    };
    write_descriptor(&dev, &d).unwrap();
    assert_eq!(read_descriptor(&dev).unwrap(), Some(d));
}

#[test]
fn byte_layout_is_as_documented() {
    let sector = encode(&sample());
    assert_eq!(&sector[0..8], b"TSRNSD01");
    assert_eq!(sector[8..12], 1u32.to_le_bytes());
    assert_eq!(sector[12..16], sector_crc(&sector).to_le_bytes());
    assert_eq!(sector[16..32], [7; 16]);
    assert_eq!(sector[32..40], MIN_NSD_BYTES.to_le_bytes());
    assert_eq!(sector[40..48], 1_700_000_000u64.to_le_bytes());
    assert_eq!(sector[48..64], [0x5a; 16]);
    assert_eq!(sector[64..66], 11u16.to_le_bytes());
    assert_eq!(&sector[72..83], b"de0704a01v1");
    assert!(sector[83..].iter().all(|&b| b == 0));
    assert!(sector[66..72].iter().all(|&b| b == 0));
}

#[test]
fn flipped_bit_is_corrupt_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, path) = drive(dir.path(), MIN_NSD_BYTES);
    // Header, id, name and reserved bytes: every part of the sector is covered.
    for byte in [9, 13, 20, 40, 64, 75, 200, 4095] {
        write_descriptor(&dev, &sample()).unwrap();
        flip_bit(&dev, byte);
        let err = read_descriptor(&dev).unwrap_err();
        assert!(
            matches!(err, NsdError::CorruptDescriptor { .. }),
            "byte {byte}: {err}"
        );
        let message = err.to_string();
        assert!(message.contains(path.to_str().unwrap()), "{message}");
        assert!(message.contains("tessera nsd create -v no"), "{message}");
        assert!(probe_in_use(&dev).is_err());
    }
}

#[test]
fn damaged_magic_means_not_an_nsd() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, _) = drive(dir.path(), MIN_NSD_BYTES);
    write_descriptor(&dev, &sample()).unwrap();
    flip_bit(&dev, 3);
    assert_eq!(read_descriptor(&dev).unwrap(), None);
}

#[test]
fn newer_version_says_to_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, _) = drive(dir.path(), MIN_NSD_BYTES);
    let mut sector = encode(&sample());
    sector[8] = 2;
    let crc = sector_crc(&sector);
    sector[12..16].copy_from_slice(&crc.to_le_bytes());
    dev.write_at(&sector, 0).unwrap();
    let err = read_descriptor(&dev).unwrap_err().to_string();
    assert!(err.contains("format version 2"), "{err}");
    assert!(err.contains("upgrade"), "{err}");
}

#[test]
fn file_system_slots_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, _) = drive(dir.path(), MIN_NSD_BYTES);
    write_descriptor(&dev, &sample()).unwrap();
    for offset in FS_DESCRIPTOR_SLOT_OFFSETS {
        let slot = AlignedBuf::from_slice(&FS_DESCRIPTOR_MAGIC);
        dev.write_at(&slot, offset).unwrap();
        assert_eq!(probe_in_use(&dev).unwrap(), InUse::FileSystem);
        dev.write_at(&AlignedBuf::zeroed(4096), offset).unwrap();
        assert_eq!(probe_in_use(&dev).unwrap(), InUse::Nsd(sample()));
    }
}

#[test]
fn too_small_device_is_refused_with_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, path) = drive(dir.path(), 8 << 20);
    let err = check_device_size(&dev).unwrap_err().to_string();
    assert!(err.contains(path.to_str().unwrap()), "{err}");
    assert!(err.contains("8388608 bytes"), "{err}");
    assert!(err.contains("16777216 bytes (16 MiB)"), "{err}");
    // Probing a small device (smaller than the slots) still works.
    let (tiny, _) = drive(dir.path(), 64 << 10);
    assert_eq!(probe_in_use(&tiny).unwrap(), InUse::Free);
}

#[test]
fn invalid_name_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, _) = drive(dir.path(), MIN_NSD_BYTES);
    let d = NsdDescriptor {
        name: "9lives".into(),
        ..sample()
    };
    let err = write_descriptor(&dev, &d).unwrap_err();
    assert!(matches!(err, NsdError::InvalidName { .. }), "{err}");
    assert_eq!(read_descriptor(&dev).unwrap(), None);
}
