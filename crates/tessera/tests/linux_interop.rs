//! Interoperability with the Linux kernel's NVMe/TCP host and target, through
//! `interop/linux-kernel.sh`: Debian's stock kernel under QEMU runs nvme-cli against
//! `tessera drive-server`, and `tessera nvme` (with a Tessera file system) against the
//! kernel's nvmet. The script prints one PASS/FAIL line per check; see interop/README.md.
//!
//! Needs root (a tap interface, FUSE), QEMU, and Debian's package archive for the kernel
//! (`.ci/run` installs QEMU; the script downloads the kernel into the target directory).

use std::path::Path;
use std::process::Command;

#[test]
fn linux_kernel_host_and_target_interoperate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // Kept between runs: the downloaded kernel and nvme-cli are reused.
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("linux-interop");
    let out = Command::new("bash")
        .arg(root.join("interop/linux-kernel.sh"))
        .arg(&work)
        .env("TESSERA", env!("CARGO_BIN_EXE_tessera"))
        .output()
        .expect("run interop/linux-kernel.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    let passes = stdout
        .lines()
        .filter(|l| l.starts_with("INTEROP PASS"))
        .count();
    let fails: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("INTEROP FAIL"))
        .collect();
    assert!(
        out.status.success() && fails.is_empty(),
        "interop failed ({}): {fails:#?}; the guest console is in {}/console.log",
        out.status,
        work.display()
    );
    // Both phases ran: the guest's checks and this side's.
    assert!(passes >= 60, "only {passes} checks passed");
    assert!(stdout.contains("INTEROP PASS tessera-read-back"));
    assert!(stdout.contains("INTEROP PASS backing-file-at16M"));
}
