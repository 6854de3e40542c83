//! Shard checkpoint images: each shard's inodes serialized (postcard) into metadata blocks of
//! the system pool. An image is only referenced by a descriptor written after the image is
//! durable, and the previous image is freed only after that descriptor is durable.

use std::sync::Arc;

use tessera_alloc::{AllocKind, AllocMap, BlockHint, Extent};
use tessera_drive::{AlignedBuf, BlockDevice};

use crate::descriptor::{FsDescriptor, ShardImage};
use crate::error::{FsError, FsResult};
use crate::inode::Inode;
use crate::meta::MetaState;

/// A shard image serialized and given its blocks, not yet written.
pub(crate) struct PreparedImage {
    bytes: Vec<u8>,
    pub(crate) extents: Vec<Extent>,
    inodes: u64,
}

/// Serializes and writes every shard of `state`, allocating image blocks from `alloc`.
pub(crate) fn format_images(
    desc: &FsDescriptor,
    devices: &[Arc<dyn BlockDevice>],
    alloc: &mut AllocMap,
    state: &MetaState,
) -> FsResult<Vec<ShardImage>> {
    let prepared = prepare_images(desc, alloc, state)?;
    write_prepared(desc, devices, &prepared)
}

/// Serializes every shard and allocates its image blocks; nothing is written. This is the
/// part of a checkpoint that needs the metadata lock.
pub(crate) fn prepare_images(
    desc: &FsDescriptor,
    alloc: &mut AllocMap,
    state: &MetaState,
) -> FsResult<Vec<PreparedImage>> {
    let mut prepared: Vec<PreparedImage> = Vec::with_capacity(state.shards.len());
    for (s, shard) in state.shards.iter().enumerate() {
        let mut inodes: Vec<&Inode> = shard.inodes.values().collect();
        inodes.sort_by_key(|i| i.attr.ino);
        let bytes = postcard::to_stdvec(&inodes).expect("inodes serialize");
        let extents = match allocate(desc, alloc, s as u64, bytes.len() as u64) {
            Ok(e) => e,
            Err(e) => {
                for extent in prepared.iter().flat_map(|p| p.extents.iter()) {
                    alloc.free(*extent).expect("just allocated");
                }
                return Err(e);
            }
        };
        prepared.push(PreparedImage {
            bytes,
            extents,
            inodes: inodes.len() as u64,
        });
    }
    Ok(prepared)
}

/// Writes prepared images and makes them durable; returns what the descriptor records.
pub(crate) fn write_prepared(
    desc: &FsDescriptor,
    devices: &[Arc<dyn BlockDevice>],
    prepared: &[PreparedImage],
) -> FsResult<Vec<ShardImage>> {
    let mut images = Vec::with_capacity(prepared.len());
    for p in prepared {
        write_bytes(desc, devices, &p.extents, &p.bytes)?;
        images.push(ShardImage {
            extents: p.extents.clone(),
            bytes: p.bytes.len() as u64,
            crc32c: crc32c::crc32c(&p.bytes),
            inodes: p.inodes,
        });
    }
    for dev in devices {
        dev.flush()?;
    }
    Ok(images)
}

fn allocate(
    desc: &FsDescriptor,
    alloc: &mut AllocMap,
    shard: u64,
    bytes: u64,
) -> FsResult<Vec<Extent>> {
    let block = u64::from(desc.block_size);
    let sub = u64::from(desc.sub_block_size);
    let mut extents = Vec::new();
    let mut left = bytes.max(1);
    let mut prev = None;
    while left > 0 {
        let extent = if left >= block {
            let hint = BlockHint {
                file_key: shard,
                block_index: extents.len() as u64,
                prev,
            };
            alloc.alloc_block(0, AllocKind::Metadata, hint)
        } else {
            alloc.alloc_fragment(0, AllocKind::Metadata, left.div_ceil(sub) as u32, prev)
        };
        let extent = match extent {
            Ok(e) => e,
            Err(e) => {
                for x in &extents {
                    alloc.free(*x).expect("just allocated");
                }
                return Err(FsError::from_alloc(e, "system", "a metadata checkpoint"));
            }
        };
        left = left.saturating_sub(u64::from(extent.sub_blocks) * sub);
        prev = Some(extent.addr);
        extents.push(extent);
    }
    Ok(extents)
}

fn write_bytes(
    desc: &FsDescriptor,
    devices: &[Arc<dyn BlockDevice>],
    extents: &[Extent],
    bytes: &[u8],
) -> FsResult<()> {
    let mut pos = 0usize;
    for e in extents {
        let cap = (u64::from(e.sub_blocks) * u64::from(desc.sub_block_size)) as usize;
        let n = cap.min(bytes.len() - pos);
        let buf = AlignedBuf::from_slice(&bytes[pos..pos + n]);
        let dev = &devices[e.addr.disk as usize];
        dev.write_at(&buf, desc.sub_block_offset(e.addr.sub_block))?;
        pos += n;
    }
    Ok(())
}

/// Loads every shard image named by `desc`.
pub(crate) fn read_images(
    desc: &FsDescriptor,
    devices: &[Arc<dyn BlockDevice>],
) -> FsResult<MetaState> {
    let mut state = MetaState::new(desc.shard_count);
    if desc.checkpoint.shards.len() != desc.shard_count as usize {
        return Err(FsError::Corrupt(format!(
            "descriptor lists {} shard images for {} shards",
            desc.checkpoint.shards.len(),
            desc.shard_count
        )));
    }
    for (s, image) in desc.checkpoint.shards.iter().enumerate() {
        let bytes = read_image(desc, devices, image)
            .map_err(|e| FsError::Corrupt(format!("checkpoint image of shard {s}: {e}")))?;
        let inodes: Vec<Inode> = postcard::from_bytes(&bytes)
            .map_err(|e| FsError::Corrupt(format!("checkpoint image of shard {s}: {e}")))?;
        for inode in inodes {
            let ino = inode.attr.ino;
            if state.shard_of(ino) != s {
                return Err(FsError::Corrupt(format!("inode {ino} found in shard {s}")));
            }
            state.apply(&crate::meta::Change::PutAttr(inode.attr))?;
            let slot = state.get_mut(ino).expect("just put");
            *slot = inode;
            slot.rebuild_derived();
        }
    }
    Ok(state)
}

fn read_image(
    desc: &FsDescriptor,
    devices: &[Arc<dyn BlockDevice>],
    image: &ShardImage,
) -> FsResult<Vec<u8>> {
    let mut out = Vec::with_capacity(image.bytes as usize);
    for e in &image.extents {
        let len = u64::from(e.sub_blocks) * u64::from(desc.sub_block_size);
        let mut buf = AlignedBuf::zeroed(len as usize);
        let dev = devices.get(e.addr.disk as usize).ok_or_else(|| {
            FsError::Corrupt(format!("image extent on unknown disk {}", e.addr.disk))
        })?;
        dev.read_at(&mut buf, desc.sub_block_offset(e.addr.sub_block))?;
        let n = (image.bytes as usize - out.len()).min(buf.len());
        out.extend_from_slice(&buf[..n]);
    }
    if out.len() as u64 != image.bytes {
        return Err(FsError::Corrupt("image shorter than recorded".into()));
    }
    if crc32c::crc32c(&out) != image.crc32c {
        return Err(FsError::Corrupt("image checksum mismatch".into()));
    }
    Ok(out)
}
