//! Formats four file-backed drives in a scratch directory and mounts them, for poking at by
//! hand: `cargo run -p tessera-fuse --example mount_scratch -- DIR`. Ctrl-C unmounts.
use std::sync::Arc;

use tessera_drive::{BlockDevice, FileDrive};
use tessera_fs::{DiskSpec, FileSystem, FormatOptions};
use tessera_nsd::descriptor::{write_descriptor, NsdDescriptor};
use tessera_nsd::{DiskUsage, NsdId};

fn main() {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).expect("usage: mount_scratch DIR"));
    std::fs::create_dir_all(dir.join("mnt")).unwrap();
    let mut disks = Vec::new();
    for i in 0..4 {
        let path = dir.join(format!("d{i}"));
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        let dev: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(&path).unwrap());
        let id = NsdId::random();
        let nd = NsdDescriptor {
            id,
            name: format!("n{i}"),
            device_bytes: 1 << 30,
            created_unix: 0,
            cluster_id: [0; 16],
        };
        write_descriptor(dev.as_ref(), &nd).unwrap();
        disks.push((id, dev));
    }
    let specs = disks
        .iter()
        .enumerate()
        .map(|(i, (id, dev))| DiskSpec {
            nsd_name: format!("n{i}"),
            nsd_id: *id,
            usage: DiskUsage::DataAndMetadata,
            failure_group: i as i32,
            pool: "system".into(),
            device: dev.clone(),
        })
        .collect();
    let opts = FormatOptions {
        block_size: 1 << 20,
        ..Default::default()
    };
    tessera_fs::format(specs, &opts, &mut |_| {}).unwrap();
    let fs = FileSystem::mount(disks).unwrap();
    let m = tessera_fuse::mount(fs.clone(), &dir.join("mnt"), &Default::default()).unwrap();
    println!("mounted at {}", dir.join("mnt").display());
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    m.unmount().unwrap();
    fs.unmount().unwrap();
}
