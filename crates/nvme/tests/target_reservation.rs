//! Persistent reservations through the drive server: two hosts on two ports share one
//! namespace; the state is one per namespace, keyed by host identifier.

mod target_util;

use target_util::*;
use tessera_nvme::target::{DriveServer, ServerError, TargetConfig};
use tessera_nvme::wire::command::{
    AdminCommand, Feature, FeatureSelect, GetFeatures, IoCommand, SetFeatures,
};
use tessera_nvme::wire::reservation::{
    encode_release_data, AcquireAction, KeyPair, RegisterAction, ReleaseAction, ReservationAcquire,
    ReservationRegister, ReservationRelease, ReservationReport, ReservationStatus, ReservationType,
};
use tessera_nvme::wire::Status;

fn register(c: &mut Client, action: RegisterAction, iekey: bool, crkey: u64, nrkey: u64) -> Status {
    register_cptpl(c, action, iekey, crkey, nrkey, 0)
}

fn register_cptpl(
    c: &mut Client,
    action: RegisterAction,
    iekey: bool,
    crkey: u64,
    nrkey: u64,
    cptpl: u8,
) -> Status {
    let cmd = IoCommand::ReservationRegister(ReservationRegister {
        nsid: 1,
        action,
        iekey,
        cptpl,
    });
    let data = KeyPair {
        crkey,
        second: nrkey,
    }
    .encode();
    c.command(cmd.to_sqe(0), Some(&data), true, 0).status()
}

fn acquire(
    c: &mut Client,
    action: AcquireAction,
    rtype: ReservationType,
    crkey: u64,
    prkey: u64,
) -> Status {
    let cmd = IoCommand::ReservationAcquire(ReservationAcquire {
        nsid: 1,
        action,
        iekey: false,
        rtype,
    });
    let data = KeyPair {
        crkey,
        second: prkey,
    }
    .encode();
    c.command(cmd.to_sqe(0), Some(&data), true, 0).status()
}

fn release(
    c: &mut Client,
    action: ReleaseAction,
    rtype: Option<ReservationType>,
    crkey: u64,
) -> Status {
    let cmd = IoCommand::ReservationRelease(ReservationRelease {
        nsid: 1,
        action,
        iekey: false,
        rtype,
    });
    c.command(cmd.to_sqe(0), Some(&encode_release_data(crkey)), true, 0)
        .status()
}

fn report(c: &mut Client, eds: bool) -> ReservationStatus {
    let done = report_command(c, eds);
    assert!(done.status().is_success());
    ReservationStatus::decode(&done.data, eds).unwrap()
}

fn report_status(c: &mut Client, eds: bool) -> Status {
    report_command(c, eds).status()
}

fn report_command(c: &mut Client, eds: bool) -> Done {
    let cmd = IoCommand::ReservationReport(ReservationReport {
        nsid: 1,
        numd: 1024 / 4 - 1,
        eds,
    });
    c.command(cmd.to_sqe(0), None, false, 1024)
}

fn conflict(s: Status) -> bool {
    s.code() == Status::RESERVATION_CONFLICT.code()
}

#[test]
fn two_hosts_write_exclusive_preempt_release_clear() {
    let f = Fixture::new();
    let a1 = Client::admin(f.addr(1), SUBNQN, HOST1, HOSTID1, 0, false);
    let a2 = Client::admin(f.addr(2), SUBNQN, HOST2, HOSTID2, 0, false);
    let mut h1 = Client::io(f.addr(1), &a1, 1, HOST1, HOSTID1, false);
    let mut h2 = Client::io(f.addr(2), &a2, 1, HOST2, HOSTID2, false);
    let block = pattern(4096, 7);

    assert!(register(&mut h1, RegisterAction::Register, false, 0, 0xaaaa).is_success());
    assert!(register(&mut h2, RegisterAction::Register, false, 0, 0xbbbb).is_success());
    // Registering again with another key conflicts.
    assert!(conflict(register(
        &mut h2,
        RegisterAction::Register,
        false,
        0,
        0xcccc
    )));
    let we = ReservationType::WriteExclusive;
    assert!(acquire(&mut h1, AcquireAction::Acquire, we, 0xaaaa, 0).is_success());
    assert!(conflict(acquire(
        &mut h2,
        AcquireAction::Acquire,
        we,
        0xbbbb,
        0
    )));

    // Holder writes; the other host's write conflicts, its read succeeds.
    assert!(h1.write(1, 0, &block, true).status().is_success());
    let denied = h2.write(1, 0, &block, true).status();
    assert!(conflict(denied) && denied.dnr());
    assert_eq!(h2.read(1, 0, 1).data, block);
    // Namespace 2 has its own (empty) reservation state.
    assert!(h2.write(2, 0, &block, true).status().is_success());

    let r = report(&mut h2, true);
    assert_eq!((r.rtype, r.regctl), (1, 2));
    let holder = r.registrants.iter().find(|x| x.holds_reservation).unwrap();
    assert_eq!((holder.hostid, holder.rkey), (HOSTID1, 0xaaaa));
    // Fabrics host identifiers are 128 bits: the regular layout cannot carry them.
    let regular = report_status(&mut h1, false);
    assert_eq!(regular.code(), Status::HOST_ID_INCONSISTENT_FORMAT.code());
    assert!(regular.dnr());

    // Host 2 preempts host 1: host 1 is unregistered and can no longer write.
    assert!(acquire(&mut h2, AcquireAction::Preempt, we, 0xbbbb, 0xaaaa).is_success());
    assert!(conflict(h1.write(1, 0, &block, true).status()));
    assert!(h2.write(1, 1, &block, true).status().is_success());
    let r = report(&mut h1, true);
    assert_eq!(r.registrants.len(), 1);
    assert_eq!(r.registrants[0].hostid, HOSTID2);
    // Releasing with the wrong type fails; the right one releases.
    assert!(!release(
        &mut h2,
        ReleaseAction::Release,
        Some(ReservationType::ExclusiveAccess),
        0xbbbb
    )
    .is_success());
    assert!(release(&mut h2, ReleaseAction::Release, Some(we), 0xbbbb).is_success());
    assert!(h1.write(1, 0, &block, true).status().is_success());

    // Registrants-only: host 1 registers again, host 2 holds; both may write.
    assert!(register(&mut h1, RegisterAction::Register, false, 0, 0x1111).is_success());
    let wero = ReservationType::WriteExclusiveRegistrantsOnly;
    assert!(acquire(&mut h2, AcquireAction::Acquire, wero, 0xbbbb, 0).is_success());
    assert!(h1.write(1, 2, &block, true).status().is_success());
    // Replace with IEKEY ignores the current key.
    assert!(register(&mut h1, RegisterAction::Replace, true, 0, 0x2222).is_success());
    assert!(conflict(release(
        &mut h1,
        ReleaseAction::Clear,
        None,
        0x1111
    )));
    assert!(release(&mut h1, ReleaseAction::Clear, None, 0x2222).is_success());
    let r = report(&mut h2, true);
    assert_eq!((r.rtype, r.regctl), (0, 0));
    assert!(conflict(acquire(
        &mut h2,
        AcquireAction::Acquire,
        we,
        0xbbbb,
        0
    )));
}

#[test]
fn exclusive_access_blocks_reads_of_other_hosts() {
    let f = Fixture::new();
    let a1 = Client::admin(f.addr(1), SUBNQN, HOST1, HOSTID1, 0, false);
    let a2 = Client::admin(f.addr(1), SUBNQN, HOST2, HOSTID2, 0, false);
    let mut h1 = Client::io(f.addr(1), &a1, 1, HOST1, HOSTID1, false);
    let mut h2 = Client::io(f.addr(1), &a2, 1, HOST2, HOSTID2, false);
    assert!(register(&mut h1, RegisterAction::Register, false, 0, 5).is_success());
    let ea = ReservationType::ExclusiveAccess;
    assert!(acquire(&mut h1, AcquireAction::Acquire, ea, 5, 0).is_success());
    assert!(conflict(h2.read(1, 0, 1).status()));
    assert!(h1.read(1, 0, 1).status().is_success());
    // The same host on another controller (another path) is the same registrant.
    let a3 = Client::admin(f.addr(2), SUBNQN, HOST1, HOSTID1, 0, false);
    let mut h1b = Client::io(f.addr(2), &a3, 1, HOST1, HOSTID1, false);
    assert!(h1b.read(1, 0, 1).status().is_success());
    // Unregistering the holder releases the reservation.
    assert!(register(&mut h1, RegisterAction::Unregister, false, 5, 0).is_success());
    assert!(h2.read(1, 0, 1).status().is_success());
}

fn set_ptpl(admin: &mut Client, nsid: u32, ptpl: bool, save: bool) -> Status {
    let cmd = AdminCommand::SetFeatures(SetFeatures {
        nsid,
        save,
        feature: Feature::ReservationPersistence { ptpl },
    });
    admin.command(cmd.to_sqe(0), None, false, 0).status()
}

fn get_ptpl(admin: &mut Client, nsid: u32, select: FeatureSelect) -> Done {
    let cmd = AdminCommand::GetFeatures(GetFeatures {
        nsid,
        fid: 0x83,
        select,
        cdw11: 0,
    });
    admin.command(cmd.to_sqe(0), None, false, 0)
}

/// RESCAP from Identify Namespace.
fn rescap(admin: &mut Client) -> u8 {
    admin.identify(0, 1).data[31]
}

/// Without a state directory a namespace cannot persist its reservations, and says so.
#[test]
fn ptpl_is_refused_without_a_state_directory() {
    let f = Fixture::new();
    let mut admin = f.admin();
    let mut h1 = Client::io(f.addr(1), &admin, 1, HOST1, HOSTID1, false);
    assert_eq!(rescap(&mut admin) & 1, 0, "RESCAP.PTPLC");
    let s = register_cptpl(&mut h1, RegisterAction::Register, false, 0, 0xa, 0b11);
    assert_eq!(s.code(), Status::INVALID_FIELD.code());
    assert!(
        report(&mut h1, true).registrants.is_empty(),
        "nothing registered"
    );
    assert!(register_cptpl(&mut h1, RegisterAction::Register, false, 0, 0xa, 0b10).is_success());
    assert_eq!(
        set_ptpl(&mut admin, 1, true, false).code(),
        Status::INVALID_FIELD.code()
    );
    let caps = get_ptpl(&mut admin, 1, FeatureSelect::SupportedCapabilities);
    assert_eq!(
        caps.cqe.dw0 & 0b111,
        0b110,
        "namespace specific, changeable, not saveable"
    );
}

/// With PTPL on, registrations and the reservation survive a restart of the drive server
/// (its power cycle): the fenced host stays fenced. Turning PTPL off makes the next
/// restart clear them.
#[test]
fn ptpl_keeps_reservations_through_a_restart() {
    let drives = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let tessera = format!(
        r#", "tessera": {{"state_dir": "{}/resv"}}"#,
        state.path().display()
    );
    let json = config_json(drives.path(), &tessera);
    let start = || DriveServer::start(TargetConfig::from_json_str(&json).unwrap()).unwrap();
    let block = pattern(4096, 3);

    let server = start();
    let (mut a1, mut h1, (mut h2, _a2)) = clients(&server);
    assert_eq!(rescap(&mut a1) & 1, 1, "RESCAP.PTPLC");
    assert!(register_cptpl(&mut h1, RegisterAction::Register, false, 0, 0xaaaa, 0b11).is_success());
    assert!(register(&mut h2, RegisterAction::Register, false, 0, 0xbbbb).is_success());
    assert!(acquire(
        &mut h1,
        AcquireAction::Acquire,
        ReservationType::WriteExclusive,
        0xaaaa,
        0
    )
    .is_success());
    // Host 1 fences host 2 by preempting its key.
    assert!(acquire(
        &mut h1,
        AcquireAction::Preempt,
        ReservationType::WriteExclusive,
        0xaaaa,
        0xbbbb
    )
    .is_success());
    assert!(conflict(h2.write(1, 10, &block, true).status()));
    let before = report(&mut h1, true);
    assert_eq!((before.ptpls, before.regctl), (1, 1));
    assert_eq!(get_ptpl(&mut a1, 1, FeatureSelect::Current).cqe.dw0, 1);
    assert_eq!(get_ptpl(&mut a1, 1, FeatureSelect::Default).cqe.dw0, 0);
    let caps = get_ptpl(&mut a1, 1, FeatureSelect::SupportedCapabilities);
    assert_eq!(
        caps.cqe.dw0 & 0b111,
        0b111,
        "saveable, namespace specific, changeable"
    );
    drop((a1, h1, h2));
    server.shutdown();

    let server = start();
    let (mut a1, mut h1, (mut h2, _a2)) = clients(&server);
    let after = report(&mut h1, true);
    assert_eq!(
        (after.generation, after.rtype, after.regctl, after.ptpls),
        (before.generation, before.rtype, 1, 1),
        "the state came back"
    );
    assert_eq!(after.registrants[0].hostid, before.registrants[0].hostid);
    assert_eq!(
        after.registrants[0].cntlid, 0xffff,
        "no controller since the restart"
    );
    assert!(
        conflict(h2.write(1, 10, &block, true).status()),
        "still fenced"
    );
    assert!(
        h1.write(1, 10, &block, true).status().is_success(),
        "the holder writes"
    );
    // The fenced host cannot get back in with its old key.
    assert!(conflict(register(
        &mut h2,
        RegisterAction::Replace,
        false,
        0xbbbb,
        0xbbbc
    )));

    // PTPL off (Set Features, with and without SV): the next restart starts clean.
    assert!(set_ptpl(&mut a1, 1, false, true).is_success());
    assert!(set_ptpl(&mut a1, 0xffff_ffff, false, false).is_success());
    assert_eq!(
        set_ptpl(&mut a1, 9, true, false).code(),
        Status::INVALID_NAMESPACE.code()
    );
    assert_eq!(report(&mut h1, true).ptpls, 0);
    drop((a1, h1, h2));
    server.shutdown();
    let server = start();
    let (mut a1, mut h1, (mut h2, _a2)) = clients(&server);
    let cleared = report(&mut h1, true);
    assert_eq!((cleared.regctl, cleared.rtype, cleared.ptpls), (0, 0, 0));
    assert!(
        h2.write(1, 10, &block, true).status().is_success(),
        "no longer fenced"
    );

    // Set Features turns it on for every namespace at once.
    assert!(set_ptpl(&mut a1, 0xffff_ffff, true, false).is_success());
    assert!(register(&mut h1, RegisterAction::Register, false, 0, 0x1111).is_success());
    drop((a1, h1, h2));
    server.shutdown();
    let server = start();
    let (_a1, mut h1, _host2) = clients(&server);
    assert_eq!(report(&mut h1, true).registrants[0].rkey, 0x1111);
    let files = std::fs::read_dir(state.path().join("resv"))
        .unwrap()
        .count();
    assert_eq!(files, 2, "one state file per namespace");
    server.shutdown();
}

/// A damaged state file stops the server from starting, with the file named: starting
/// without it would lift every fence in it.
#[test]
fn a_damaged_reservation_state_file_stops_the_start() {
    let drives = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let tessera = format!(
        r#", "tessera": {{"state_dir": "{}"}}"#,
        state.path().display()
    );
    let json = config_json(drives.path(), &tessera);
    let start = || DriveServer::start(TargetConfig::from_json_str(&json).unwrap());
    let server = start().unwrap();
    let (_a1, mut h1, _host2) = clients(&server);
    assert!(register_cptpl(&mut h1, RegisterAction::Register, false, 0, 0xaaaa, 0b11).is_success());
    drop(h1);
    server.shutdown();
    let file = std::fs::read_dir(state.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[40] ^= 0x10;
    std::fs::write(&file, &bytes).unwrap();
    let Err(err) = start() else {
        panic!("a damaged state file is refused");
    };
    assert!(
        matches!(err, ServerError::ReservationState { nsid: 1, .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&file.display().to_string()) && text.contains("checksum"),
        "{text}"
    );
    // Removing it, as the message says, starts the server with no registrations.
    std::fs::remove_file(&file).unwrap();
    let server = start().unwrap();
    let (_a1, mut h1, _host2) = clients(&server);
    assert!(report(&mut h1, true).registrants.is_empty());
    server.shutdown();
}

/// Host 1 on port 1 and host 2 on port 2: host 1's admin queue, both I/O queues, and
/// host 2's admin queue (kept, since its controller lives as long as it does).
fn clients(server: &DriveServer) -> (Client, Client, (Client, Client)) {
    let (p1, p2) = (server.local_addr(1).unwrap(), server.local_addr(2).unwrap());
    let a1 = Client::admin(p1, SUBNQN, HOST1, HOSTID1, 0, false);
    let a2 = Client::admin(p2, SUBNQN, HOST2, HOSTID2, 0, false);
    let h1 = Client::io(p1, &a1, 1, HOST1, HOSTID1, false);
    let h2 = Client::io(p2, &a2, 1, HOST2, HOSTID2, false);
    (a1, h1, (h2, a2))
}
