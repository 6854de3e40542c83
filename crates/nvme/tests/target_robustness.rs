//! The drive server under bad input and failures: every error gets the specified answer
//! (an NVMe status or a C2HTermReq), and the server keeps serving other connections.

mod target_util;

use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use target_util::*;
use tessera_drive::BlockDevice;
use tessera_nvme::target::{DriveServer, ServerError, TargetConfig};
use tessera_nvme::wire::command::{io_opcode, IoCommand, ReadWrite, WriteZeroes};
use tessera_nvme::wire::pdu::{encode_pdu, PduHeader};
use tessera_nvme::wire::{
    DataHeader, DigestConfig, Fes, PduReader, SglDescriptor, Side, Sqe, Status,
};

/// The server still serves a fresh host after whatever a test did.
fn still_serving(f: &Fixture) {
    let admin = f.admin();
    let mut io = Client::io(f.addr(1), &admin, 1, HOST1, HOSTID1, false);
    let data = pattern(4096, 99);
    assert!(io.write(1, 1000, &data, true).status().is_success());
    assert_eq!(io.read(1, 1000, 1).data, data);
}

fn expect_term(c: &mut Client, fes: Fes) {
    let pdu = c.next_pdu().expect("a C2HTermReq");
    let PduHeader::C2HTermReq(t) = pdu.header else {
        panic!("expected C2HTermReq, got {:?}", pdu.header)
    };
    assert_eq!(t.fes, fes as u16);
    assert!(c.next_pdu().is_err(), "connection closed after the TermReq");
}

#[test]
fn garbage_instead_of_icreq() {
    let f = Fixture::new();
    let mut s = std::net::TcpStream::connect(f.addr(1)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut reader = PduReader::new(Side::Host, 4096, DigestConfig::NONE);
    let pdu = reader.read_pdu(&mut s).unwrap();
    let PduHeader::C2HTermReq(t) = pdu.header else {
        panic!("{:?}", pdu.header)
    };
    assert_eq!(t.fes, Fes::InvalidHeaderField as u16);
    assert!(reader.read_pdu(&mut s).is_err());
    // A connection that says nothing and goes away does not disturb anything either.
    drop(std::net::TcpStream::connect(f.addr(1)).unwrap());
    still_serving(&f);
}

#[test]
fn command_errors_get_statuses() {
    let f = Fixture::new();
    let mut admin = f.admin();
    let done = admin.command(Sqe::new(0x01, 0), None, false, 0);
    assert_eq!(done.status().code(), Status::INVALID_OPCODE.code());
    let mut io = Client::io(f.addr(1), &admin, 1, HOST1, HOSTID1, false);
    let done = io.command(
        Sqe {
            nsid: 1,
            ..Sqe::new(0x7c, 0)
        },
        None,
        false,
        0,
    );
    assert_eq!(done.status().code(), Status::INVALID_OPCODE.code());
    let blocks = NS_BYTES / 4096;
    let done = io.read(1, blocks - 1, 2);
    assert_eq!(done.status().code(), Status::LBA_OUT_OF_RANGE.code());
    assert!(done.status().dnr());
    let done = io.write(1, u64::MAX, &[0; 4096], true);
    assert_eq!(done.status().code(), Status::LBA_OUT_OF_RANGE.code());
    assert_eq!(
        io.read(7, 0, 1).status().code(),
        Status::INVALID_NAMESPACE.code()
    );
    // A write whose SGL length disagrees with NLB.
    let rw = ReadWrite::new(1, 0, 2, false).unwrap();
    let done = io.command(rw.to_sqe(io_opcode::WRITE, 0), Some(&[0; 4096]), true, 0);
    assert_eq!(done.status().code(), Status::DATA_SGL_LENGTH_INVALID.code());
    // MDTS (4 MiB) exactly, then one block more.
    let rw = ReadWrite::new(1, 0, 1024, false).unwrap();
    let done = io.command(rw.to_sqe(io_opcode::READ, 0), None, false, 1024 * 4096);
    assert!(done.status().is_success());
    let rw = ReadWrite::new(1, 0, 1025, false).unwrap();
    let done = io.command(rw.to_sqe(io_opcode::READ, 0), None, false, 1025 * 4096);
    assert!(!done.status().is_success());
    // The queue still works.
    assert!(io.read(1, 0, 1).status().is_success());
    still_serving(&f);
}

#[test]
fn header_digest_error_terminates_data_digest_error_does_not() {
    let f = Fixture::new();
    let admin = Client::admin(f.addr(1), SUBNQN, HOST1, HOSTID1, 0, true);
    let mut io = Client::io(f.addr(1), &admin, 1, HOST1, HOSTID1, true);
    let mut sqe = ReadWrite::new(1, 5, 1, false)
        .unwrap()
        .to_sqe(io_opcode::WRITE, 77);
    sqe.flags = 0x40;
    sqe.dptr = SglDescriptor::in_capsule(0, 4096);
    let mut bytes = encode_pdu(&PduHeader::CapsuleCmd(sqe), &[7; 4096], &io.send).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    io.send_raw(&bytes);
    let done = io.wait(77, &[], 0);
    assert_eq!(
        done.status().code(),
        Status::TRANSIENT_TRANSPORT_ERROR.code()
    );
    assert_eq!(
        io.read(1, 5, 1).data,
        vec![0; 4096],
        "the bad data was not written"
    );

    let mut bytes = encode_pdu(&PduHeader::CapsuleCmd(sqe), &[7; 4096], &io.send).unwrap();
    bytes[72] ^= 0xff;
    io.send_raw(&bytes);
    expect_term(&mut io, Fes::HeaderDigestError);
    still_serving(&f);
}

#[test]
fn h2c_data_outside_the_r2t_and_disconnect_mid_transfer() {
    let f = Fixture::with_tessera(r#", "tessera": {"maxh2cdata_bytes": 16384}"#);
    let admin = f.admin();
    let mut io = Client::io(f.addr(1), &admin, 1, HOST1, HOSTID1, false);
    let rw = ReadWrite::new(1, 0, 16, false).unwrap();
    let cid = io.send_capsule(rw.to_sqe(io_opcode::WRITE, 0), Some(&[0; 65536]), false, 0);
    let pdu = io.next_pdu().unwrap();
    let PduHeader::R2T(r2t) = pdu.header else {
        panic!("{:?}", pdu.header)
    };
    assert_eq!((r2t.r2to, r2t.r2tl), (0, 16384));
    // 20 KiB against a 16 KiB R2T.
    let header = PduHeader::H2CData(DataHeader::h2c(cid, r2t.ttag, 0, 20480, true));
    let bytes = encode_pdu(&header, &[1; 20480], &io.send).unwrap();
    io.send_raw(&bytes);
    expect_term(&mut io, Fes::DataTransferLimitExceeded);

    // A host that vanishes half-way through a transfer.
    let mut io = Client::io(f.addr(1), &admin, 2, HOST1, HOSTID1, false);
    let cid = io.send_capsule(rw.to_sqe(io_opcode::WRITE, 0), Some(&[0; 65536]), false, 0);
    let pdu = io.next_pdu().unwrap();
    let PduHeader::R2T(r2t) = pdu.header else {
        panic!("{:?}", pdu.header)
    };
    io.send_h2c(cid, r2t.ttag, 0, &[3; 8192]);
    drop(io);
    still_serving(&f);
}

#[test]
fn keep_alive_timeout_ends_the_association() {
    let f = Fixture::new();
    let admin = Client::admin(f.addr(1), SUBNQN, HOST1, HOSTID1, 300, false);
    let mut io = Client::io(f.addr(1), &admin, 1, HOST1, HOSTID1, false);
    assert!(io.read(1, 0, 1).status().is_success());
    std::thread::sleep(Duration::from_millis(1200));
    assert!(io.next_pdu().is_err(), "I/O queue closed");
    let mut admin = admin;
    assert!(admin.next_pdu().is_err(), "admin queue closed");
    // Keep Alive commands keep another association alive.
    let mut live = Client::admin(f.addr(1), SUBNQN, HOST1, HOSTID1, 400, false);
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(150));
        assert!(live
            .command(Sqe::new(0x18, 0), None, false, 0)
            .status()
            .is_success());
    }
    still_serving(&f);
}

#[test]
fn disabling_a_port_drops_its_connections_and_enabling_listens_again() {
    let f = Fixture::new();
    let addr = f.addr(1);
    let admin = f.admin();
    let mut io = Client::io(addr, &admin, 1, HOST1, HOSTID1, false);
    let mut other = Client::admin(f.addr(2), SUBNQN, HOST1, HOSTID1, 0, false);
    let accepted = |f: &Fixture| {
        let stats = f.server.stats();
        let port = stats.ports.iter().find(|p| p.portid == 1).unwrap();
        port.connections_total
    };
    f.server.set_port_enabled(1, false).unwrap();
    assert!(io.next_pdu().is_err());
    let before = accepted(&f);
    if let Ok(stream) = std::net::TcpStream::connect(addr) {
        // Not this server: another test's listener took the freed port, or the connect
        // picked the port itself as its source (a loopback self-connect).
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            accepted(&f),
            before,
            "the disabled port accepted a connection"
        );
        drop(stream);
    }
    assert!(
        other.identify(1, 0).status().is_success(),
        "port 2 unaffected"
    );
    f.server.set_port_enabled(1, true).unwrap();
    assert_eq!(f.addr(1), addr);
    still_serving(&f);
    let stats = f.server.stats();
    assert!(stats.ports[0].enabled && stats.ports[0].connections_total >= 3);
}

/// The error completions the server counted for namespace `nsid`.
fn namespace_errors(server: &DriveServer, nsid: u32) -> u64 {
    server
        .stats()
        .namespaces
        .into_iter()
        .find(|n| n.nsid == nsid)
        .expect("the namespace is exported")
        .errors
}

#[test]
fn drive_errors_map_to_media_status() {
    let dir = tempfile::tempdir().unwrap();
    let config = TargetConfig::from_json_str(&config_json(dir.path(), "")).unwrap();
    // Bad media from 1 MiB on.
    let open = |p: &Path| -> std::io::Result<Arc<dyn BlockDevice>> {
        let drive = tessera_testkit::SimDrive::open(p)?;
        drive.faults.bad_from.store(1 << 20, Ordering::Relaxed);
        Ok(Arc::new(drive))
    };
    let server = DriveServer::start_with(config, &open).unwrap();
    let addr = server.local_addr(1).unwrap();
    let admin = Client::admin(addr, SUBNQN, HOST1, HOSTID1, 0, false);
    let mut io = Client::io(addr, &admin, 1, HOST1, HOSTID1, false);
    let done = io.read(1, 256, 1);
    assert_eq!(done.status().code(), Status::UNRECOVERED_READ_ERROR.code());
    let done = io.write(1, 300, &[1; 4096], true);
    assert_eq!(done.status().code(), Status::WRITE_FAULT.code());
    assert!(io.read(1, 0, 1).status().is_success());
    assert_eq!(namespace_errors(&server, 1), 2);
    server.shutdown();
}

/// Errors of reads on the connection's io_uring (the path of namespaces whose device the
/// server opened itself): the backing file shrinks under the server, as when an operator
/// truncates it, so ring reads past the new end come back short and the server's retry
/// through the device fails. Whole and partly failed multi-piece reads get the media
/// status, and the connection and the other namespace keep working.
#[test]
fn ring_read_errors_map_to_media_status() {
    let f = Fixture::new();
    let admin = f.admin();
    let mut io = Client::io(f.addr(1), &admin, 1, HOST1, HOSTID1, false);
    let data = pattern(4096, 7);
    assert!(io.write(1, 0, &data, true).status().is_success());
    assert_eq!(io.read(1, 0, 1).data, data, "ring read before the fault");
    std::fs::OpenOptions::new()
        .write(true)
        .open(f.dir.path().join("d1"))
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let done = io.read(1, 512, 1);
    assert_eq!(done.status().code(), Status::UNRECOVERED_READ_ERROR.code());
    assert!(done.status().dnr());
    // 1 MiB from 512 KiB: the first two 256 KiB pieces read, the last two fail; the
    // command fails as a whole.
    let done = io.read(1, 128, 256);
    assert_eq!(done.status().code(), Status::UNRECOVERED_READ_ERROR.code());
    assert_eq!(
        io.read(1, 0, 1).data,
        data,
        "same connection, readable part"
    );
    assert_eq!(namespace_errors(&f.server, 1), 2);
    assert!(io.read(2, 4096, 8).status().is_success(), "namespace 2");
    drop(io);
    drop(admin);
    still_serving(&f);
}

/// A tmpfs mount that is unmounted when dropped.
struct SmallTmpfs(tempfile::TempDir);

impl SmallTmpfs {
    /// `None` where this process may not mount (not root).
    fn mount(bytes: u64) -> Option<SmallTmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(SmallTmpfs(dir))
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

/// Namespaces on sparse files whose file system fills up (a thin-provisioned drive out of
/// space): writes on the connection's io_uring, through R2T and the worker pool, and
/// Write Zeroes get Capacity Exceeded, not a media error; what was written reads back;
/// deallocating blocks gives the space back and writes succeed again.
#[test]
fn a_full_backing_store_gives_capacity_exceeded() {
    let Some(fs) = SmallTmpfs::mount(2 << 20) else {
        // Like the FUSE tests: only where this process may mount (root, CAP_SYS_ADMIN).
        eprintln!("skipped: this process cannot mount a tmpfs");
        return;
    };
    let config = TargetConfig::from_json_str(&config_json(fs.0.path(), "")).unwrap();
    let server = DriveServer::start(config).unwrap();
    let addr = server.local_addr(1).unwrap();
    let admin = Client::admin(addr, SUBNQN, HOST1, HOSTID1, 0, false);
    let mut io = Client::io(addr, &admin, 1, HOST1, HOSTID1, false);
    let capacity_exceeded = |s: Status| s.code() == Status::CAPACITY_EXCEEDED.code() && s.dnr();

    // 4 KiB in-capsule writes until the 2 MiB file system is full.
    let mut written = Vec::new();
    let full = loop {
        let slba = written.len() as u64 * 3;
        let data = pattern(4096, slba);
        let done = io.write(1, slba, &data, true);
        if !done.status().is_success() {
            break done.status();
        }
        written.push((slba, data));
        assert!(written.len() < 1024, "2 MiB of tmpfs took 4 MiB of writes");
    };
    assert!(capacity_exceeded(full), "{full:?}");
    assert!(written.len() >= 64, "only {} blocks fit", written.len());
    // A large write (R2T, worker pool) and Write Zeroes without deallocation fail the same.
    let done = io.write(1, 8192, &pattern(1 << 20, 5), false);
    assert!(capacity_exceeded(done.status()), "{:?}", done.status());
    let wz = IoCommand::WriteZeroes(WriteZeroes {
        nsid: 1,
        slba: 9000,
        nlb: 255,
        fua: false,
        deallocate: false,
    });
    let done = io.command(wz.to_sqe(0), None, false, 0);
    assert!(capacity_exceeded(done.status()), "{:?}", done.status());
    for (slba, data) in &written {
        assert_eq!(&io.read(1, *slba, 1).data, data, "block {slba}");
    }
    // Trim half of what was written: the writes fit again.
    for (slba, _) in written.iter().step_by(2) {
        assert!(io.deallocate(1, *slba, 1).status().is_success());
    }
    let data = pattern(4096, 77);
    assert!(io.write(1, 1, &data, true).status().is_success());
    assert_eq!(io.read(1, 1, 1).data, data);
    drop((io, admin));
    server.shutdown();
}

#[test]
fn missing_device_fails_before_listening() {
    let dir = tempfile::tempdir().unwrap();
    let json = config_json(dir.path(), "");
    std::fs::remove_file(dir.path().join("d2")).unwrap();
    let config = TargetConfig::from_json_str(&json).unwrap();
    let err = DriveServer::start(config).unwrap_err();
    assert!(matches!(err, ServerError::Device { nsid: 2, .. }), "{err}");
    assert!(err.to_string().contains("d2"), "{err}");
}

/// Sends a 1 MiB Write whose data goes as four 256 KiB H2CData PDUs (the drive server
/// writes each piece as it arrives), corrupting the data digest of PDU `bad_digest`.
fn streamed_write(io: &mut Client, slba: u64, data: &[u8], bad_digest: Option<usize>) -> Done {
    let rw = ReadWrite::new(1, slba, (data.len() / 4096) as u32, false).unwrap();
    let cid = io.send_capsule(rw.to_sqe(io_opcode::WRITE, 0), Some(data), false, 0);
    let pdu = io.next_pdu().unwrap();
    let PduHeader::R2T(r2t) = pdu.header else {
        panic!("{:?}", pdu.header)
    };
    assert_eq!((r2t.r2to, r2t.r2tl as usize), (0, data.len()));
    let piece = data.len() / 4;
    for i in 0..4 {
        let chunk = &data[i * piece..(i + 1) * piece];
        let header = PduHeader::H2CData(DataHeader::h2c(
            cid,
            r2t.ttag,
            (i * piece) as u32,
            piece as u32,
            i == 3,
        ));
        let mut bytes = encode_pdu(&header, chunk, &io.send).unwrap();
        if bad_digest == Some(i) {
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff;
        }
        io.send_raw(&bytes);
    }
    io.wait(cid, &[], 0)
}

#[test]
fn streamed_writes_land_and_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let config = TargetConfig::from_json_str(&config_json(dir.path(), "")).unwrap();
    // Bad media from 16 MiB on.
    let open = |p: &Path| -> std::io::Result<Arc<dyn BlockDevice>> {
        let drive = tessera_testkit::SimDrive::open(p)?;
        drive.faults.bad_from.store(16 << 20, Ordering::Relaxed);
        Ok(Arc::new(drive))
    };
    let server = DriveServer::start_with(config, &open).unwrap();
    let addr = server.local_addr(1).unwrap();
    let admin = Client::admin(addr, SUBNQN, HOST1, HOSTID1, 0, true);
    let mut io = Client::io(addr, &admin, 1, HOST1, HOSTID1, true);
    let data: Vec<u8> = (0..1 << 20)
        .map(|i: u32| (i * 7 + i / 4096) as u8)
        .collect();

    // Whole and in place.
    assert!(streamed_write(&mut io, 256, &data, None)
        .status()
        .is_success());
    assert_eq!(io.read(1, 256, 256).data, data);

    // A data digest error in the third PDU fails the command; the queue stays in sync.
    let done = streamed_write(&mut io, 512, &data, Some(2));
    assert_eq!(
        done.status().code(),
        Status::TRANSIENT_TRANSPORT_ERROR.code()
    );
    assert!(io.read(1, 0, 1).status().is_success());

    // The drive fails past 16 MiB: a write across the boundary (its last two pieces fail)
    // is a Write Fault, counted once; with the digest failure, two failed writes.
    let done = streamed_write(&mut io, 4096 - 128, &data, None);
    assert_eq!(done.status().code(), Status::WRITE_FAULT.code());
    assert!(done.status().dnr());
    let errors = |server: &DriveServer| {
        server
            .stats()
            .namespaces
            .into_iter()
            .find(|n| n.nsid == 1)
            .unwrap()
            .errors
    };
    assert_eq!(errors(&server), 2);

    // A full queue of streamed writes at once, all answered.
    let cids: Vec<(u16, u16)> = (0..8u64)
        .map(|i| {
            let rw = ReadWrite::new(1, 2048 + i * 256, 256, false).unwrap();
            let cid = io.send_capsule(
                rw.to_sqe(io_opcode::WRITE, 10 + i as u16),
                Some(&data),
                false,
                0,
            );
            let PduHeader::R2T(r2t) = io.next_pdu().unwrap().header else {
                panic!("R2T expected")
            };
            (cid, r2t.ttag)
        })
        .collect();
    for &(cid, ttag) in &cids {
        for i in 0..4 {
            let piece = &data[i << 18..(i + 1) << 18];
            let header = PduHeader::H2CData(DataHeader::h2c(
                cid,
                ttag,
                (i << 18) as u32,
                1 << 18,
                i == 3,
            ));
            io.send_raw(&encode_pdu(&header, piece, &io.send).unwrap());
        }
    }
    let mut answered = 0;
    while answered < cids.len() {
        match io.next_pdu().unwrap().header {
            PduHeader::CapsuleResp(cqe) => {
                assert!(cids.iter().any(|(c, _)| *c == cqe.cid));
                assert!(cqe.status.is_success(), "{cqe:?}");
                answered += 1;
            }
            other => panic!("unexpected PDU {other:?}"),
        }
    }
    for i in 0..8u64 {
        assert_eq!(io.read(1, 2048 + i * 256, 256).data, data);
    }
    server.shutdown();
}

/// A namespace with `volatile_write_cache`: acknowledged writes stay in the server's memory
/// (readable, not in the backing file) until Flush; a FUA write reaches the file at once.
/// Identify Controller reports the cache, so hosts know to send Flush.
#[test]
fn volatile_write_cache_holds_writes_until_flush_or_fua() {
    let dir = tempfile::tempdir().unwrap();
    let text = config_json(dir.path(), "").replacen(
        r#""ana_grpid": 1}"#,
        r#""ana_grpid": 1, "volatile_write_cache": {"early_destage_one_in": 0}}"#,
        1,
    );
    let server = DriveServer::start(TargetConfig::from_json_str(&text).unwrap()).unwrap();
    let addr = server.local_addr(1).unwrap();
    let mut admin = Client::admin(addr, SUBNQN, HOST1, HOSTID1, 0, false);
    let (_, cns_ctrl, ..) = identify_cns();
    let id = admin.identify(cns_ctrl, 0);
    assert_eq!(
        id.data[525] & 1,
        1,
        "Identify Controller VWC: cache present"
    );
    let mut io = Client::io(addr, &admin, 1, HOST1, HOSTID1, false);
    let on_file = |lba: u64| {
        use std::os::unix::fs::FileExt;
        let mut b = vec![0u8; 4096];
        let f = std::fs::File::open(dir.path().join("d1")).unwrap();
        f.read_exact_at(&mut b, lba * 4096).unwrap();
        b
    };
    let (cached, forced) = (pattern(8192, 1), pattern(4096, 2));
    assert!(io.write(1, 10, &cached, true).status().is_success());
    assert_eq!(io.read(1, 10, 2).data, cached, "reads see the cache");
    assert_eq!(
        on_file(10),
        vec![0; 4096],
        "not flushed: not in the backing file"
    );
    let fua = ReadWrite::new(1, 20, 1, true).unwrap();
    let done = io.command(fua.to_sqe(io_opcode::WRITE, 0), Some(&forced), true, 0);
    assert!(done.status().is_success());
    assert_eq!(
        on_file(20),
        forced,
        "FUA: in the backing file on completion"
    );
    let done = io.command(IoCommand::Flush { nsid: 1 }.to_sqe(0), None, false, 0);
    assert!(done.status().is_success());
    assert_eq!(on_file(11), cached[4096..], "flushed");
    server.shutdown();
}
