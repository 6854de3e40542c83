//! Persistent reservations through the drive server: two hosts on two ports share one
//! namespace; the state is one per namespace, keyed by host identifier.

mod target_util;

use target_util::*;
use tessera_nvme::wire::command::IoCommand;
use tessera_nvme::wire::reservation::{
    encode_release_data, AcquireAction, KeyPair, RegisterAction, ReleaseAction, ReservationAcquire,
    ReservationRegister, ReservationRelease, ReservationReport, ReservationStatus, ReservationType,
};
use tessera_nvme::wire::Status;

fn register(c: &mut Client, action: RegisterAction, iekey: bool, crkey: u64, nrkey: u64) -> Status {
    let cmd = IoCommand::ReservationRegister(ReservationRegister {
        nsid: 1,
        action,
        iekey,
        cptpl: 0,
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
