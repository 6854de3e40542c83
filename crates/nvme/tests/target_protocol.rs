//! The drive server over real TCP: identify data, discovery and ANA logs, access control,
//! data integrity for in-capsule and R2T writes with and without digests, ANA failover.

mod target_util;

use target_util::*;
use tessera_nvme::target::AnaState;
use tessera_nvme::wire::command::{cns, io_opcode, IoCommand, WriteZeroes};
use tessera_nvme::wire::fabrics::CNTLID_DYNAMIC;
use tessera_nvme::wire::identify::{
    cmic, cntrltype, decode_nsid_list, oncs, IdentifyController, IdentifyNamespace, NsIdDescriptor,
};
use tessera_nvme::wire::log::{lid, subtype, AnaLog, DiscoveryLog};
use tessera_nvme::wire::{Sqe, Status};

#[test]
fn identify_controller_and_namespaces() {
    let f = Fixture::new();
    let mut admin = f.admin();
    let done = admin.identify(cns::CONTROLLER, 0);
    assert!(done.status().is_success());
    let id = IdentifyController::decode(&done.data).unwrap();
    assert_eq!(id.cntlid, admin.cntlid);
    assert_eq!(id.cntrltype, cntrltype::IO);
    assert_eq!(id.subnqn.as_ref().unwrap().as_str(), SUBNQN);
    assert_eq!(id.sn.as_str(), "JBOF1");
    assert_eq!(id.mn.as_str(), "Tessera drive server");
    assert_eq!(
        id.cmic & (cmic::MULTI_CONTROLLER | cmic::ANA_REPORTING),
        cmic::MULTI_CONTROLLER | cmic::ANA_REPORTING
    );
    assert_eq!(
        id.oncs & (oncs::DSM | oncs::WRITE_ZEROES | oncs::RESERVATIONS),
        0x2c
    );
    assert!(id.kas > 0 && id.sgls & 1 == 1 && id.icdoff == 0);
    assert_eq!(id.in_capsule_data_bytes(), 16384);
    assert!(id.nanagrpid >= 2 && id.anagrpmax >= 2 && id.mnan >= 2);

    let list = decode_nsid_list(&admin.identify(cns::ACTIVE_NAMESPACES, 0).data).unwrap();
    assert_eq!(list, vec![1, 2]);
    let ns1 = IdentifyNamespace::decode(&admin.identify(cns::NAMESPACE, 1).data).unwrap();
    assert_eq!(ns1.nsze, NS_BYTES / 4096);
    assert_eq!(ns1.block_bytes(), Ok(4096));
    assert_eq!((ns1.nmic & 1, ns1.anagrpid), (1, 1));
    assert_eq!(ns1.rescap & 0x7e, 0x7e);
    let ns2 = IdentifyNamespace::decode(&admin.identify(cns::NAMESPACE, 2).data).unwrap();
    assert_eq!(ns2.anagrpid, 2);
    let descs =
        NsIdDescriptor::decode_list(&admin.identify(cns::NS_ID_DESCRIPTORS, 1).data).unwrap();
    assert!(descs.contains(&NsIdDescriptor::Nguid(ns1.nguid)));
    assert_eq!(
        admin.identify(cns::NS_ID_DESCRIPTORS, 9).status().code(),
        Status::INVALID_NAMESPACE.code()
    );

    // The same namespace through the other port has the same identity (multipath key)
    // and a different controller ID.
    let mut other = Client::admin(f.addr(2), SUBNQN, HOST1, HOSTID1, 0, false);
    assert_ne!(other.cntlid, admin.cntlid);
    let again = IdentifyNamespace::decode(&other.identify(cns::NAMESPACE, 1).data).unwrap();
    assert_eq!(again.nguid, ns1.nguid);
    let id2 = IdentifyController::decode(&other.identify(cns::CONTROLLER, 0).data).unwrap();
    assert_eq!(id2.in_capsule_data_bytes(), 8192);
}

#[test]
fn discovery_lists_allowed_subsystems_on_every_port() {
    let f = Fixture::new();
    let disc = tessera_nvme::wire::text::DISCOVERY_NQN;
    let mut d = Client::admin(f.addr(1), disc, HOST1, HOSTID1, 0, false);
    let id = IdentifyController::decode(&d.identify(cns::CONTROLLER, 0).data).unwrap();
    assert_eq!(id.cntrltype, cntrltype::DISCOVERY);
    let log = DiscoveryLog::decode(&d.log_page(lid::DISCOVERY, 0, 4096).data).unwrap();
    assert_eq!(log.entries.len(), 2);
    let mut ports: Vec<u16> = log.entries.iter().map(|e| e.portid).collect();
    ports.sort_unstable();
    assert_eq!(ports, vec![1, 2]);
    for e in &log.entries {
        assert_eq!(e.subtype, subtype::NVM);
        assert_eq!(e.subnqn.as_str(), SUBNQN);
        assert_eq!(e.cntlid, CNTLID_DYNAMIC);
        let addr = f.addr(e.portid);
        assert_eq!(e.traddr.as_str(), "127.0.0.1");
        assert_eq!(e.trsvcid.as_str(), addr.port().to_string());
    }
    // A host that may not access the subsystem does not see it.
    let mut denied = Client::admin(f.addr(1), disc, HOST_DENIED, [9; 16], 0, false);
    let log = DiscoveryLog::decode(&denied.log_page(lid::DISCOVERY, 0, 2048).data).unwrap();
    assert!(log.entries.is_empty());
    // Disabling a port changes the generation counter and drops its entry.
    let genctr = log.genctr;
    f.server.set_port_enabled(2, false).unwrap();
    let log = DiscoveryLog::decode(&d.log_page(lid::DISCOVERY, 0, 4096).data).unwrap();
    assert_eq!(log.entries.len(), 1);
    assert!(log.genctr > genctr);
}

#[test]
fn access_control_on_connect() {
    let f = Fixture::new();
    let mut c = Client::handshake(f.addr(1), false);
    let done = c.connect(0, CNTLID_DYNAMIC, SUBNQN, HOST_DENIED, [9; 16], 0);
    assert_eq!(done.status().code(), Status::CONNECT_INVALID_HOST.code());
    assert!(
        c.next_pdu().is_err(),
        "connection closed after a refused Connect"
    );

    let mut c = Client::handshake(f.addr(1), false);
    let done = c.connect(
        0,
        CNTLID_DYNAMIC,
        "nqn.2024-01.io.tessera:nosuch",
        HOST1,
        HOSTID1,
        0,
    );
    assert_eq!(
        done.status().code(),
        Status::CONNECT_INVALID_PARAMETERS.code()
    );
    assert_eq!(done.cqe.dw0, 1 << 16 | 256, "IATTR=1 IPO=SUBNQN");

    // An I/O queue must come from the same host as the admin queue.
    let admin = f.admin();
    let mut c = Client::handshake(f.addr(1), false);
    let done = c.connect(1, admin.cntlid, SUBNQN, HOST2, HOSTID2, 0);
    assert_eq!(
        done.status().code(),
        Status::CONNECT_INVALID_PARAMETERS.code()
    );
    // Commands before Connect are refused.
    let mut c = Client::handshake(f.addr(1), false);
    let done = c.identify(cns::CONTROLLER, 0);
    assert_eq!(done.status().code(), Status::COMMAND_SEQUENCE_ERROR.code());
}

fn roundtrip(digests: bool) {
    let f = Fixture::with_tessera(r#", "tessera": {"maxh2cdata_bytes": 65536}"#);
    let admin = Client::admin(f.addr(1), SUBNQN, HOST1, HOSTID1, 0, digests);
    let mut io = Client::io(f.addr(1), &admin, 1, HOST1, HOSTID1, digests);
    assert_eq!(io.maxh2cdata, 65536);
    let small = pattern(8192, 1);
    assert!(io.write(1, 10, &small, true).status().is_success());
    let big = pattern(1 << 20, 2);
    assert!(io.write(1, 100, &big, false).status().is_success());
    assert_eq!(io.read(1, 10, 2).data, small);
    assert_eq!(io.read(1, 100, 256).data, big);
    // The other namespace is untouched.
    assert_eq!(io.read(2, 100, 1).data, vec![0; 4096]);
    let flush = Sqe {
        nsid: 1,
        ..Sqe::new(io_opcode::FLUSH, 0)
    };
    assert!(io.command(flush, None, false, 0).status().is_success());
    let stats = f.server.stats();
    let ns1 = stats.namespaces.iter().find(|n| n.nsid == 1).unwrap();
    assert_eq!(ns1.write_bytes, 8192 + (1 << 20));
    assert!(stats.ports[0].commands >= 6);
}

#[test]
fn data_roundtrip_without_digests() {
    roundtrip(false);
}

#[test]
fn data_roundtrip_with_digests() {
    roundtrip(true);
}

#[test]
fn write_zeroes_and_deallocate_read_back_zeroes() {
    let f = Fixture::new();
    let admin = f.admin();
    let mut io = Client::io(f.addr(1), &admin, 1, HOST1, HOSTID1, false);
    let data = pattern(64 * 1024, 3);
    assert!(io.write(1, 0, &data, false).status().is_success());
    let wz = IoCommand::WriteZeroes(WriteZeroes {
        nsid: 1,
        slba: 0,
        nlb: 3,
        fua: false,
        deallocate: false,
    });
    assert!(io
        .command(wz.to_sqe(0), None, false, 0)
        .status()
        .is_success());
    let back = io.read(1, 0, 16).data;
    assert_eq!(&back[..4 * 4096], &vec![0; 4 * 4096][..]);
    assert_eq!(&back[4 * 4096..], &data[4 * 4096..]);
    assert!(io.deallocate(1, 8, 8).status().is_success());
    assert_eq!(io.read(1, 8, 8).data, vec![0; 8 * 4096]);
    assert_eq!(io.read(1, 4, 4).data, &data[4 * 4096..8 * 4096]);
}

#[test]
fn ana_log_per_port_and_failover() {
    let f = Fixture::new();
    let mut a1 = f.admin();
    let mut a2 = Client::admin(f.addr(2), SUBNQN, HOST1, HOSTID1, 0, false);
    let log1 = AnaLog::decode(&a1.log_page(lid::ANA, 0, 4096).data).unwrap();
    let log2 = AnaLog::decode(&a2.log_page(lid::ANA, 0, 4096).data).unwrap();
    let state = |log: &AnaLog, g: u32| log.groups.iter().find(|x| x.anagrpid == g).unwrap().clone();
    assert_eq!(state(&log1, 1).state, AnaState::Optimized);
    assert_eq!(state(&log1, 1).nsids, vec![1]);
    assert_eq!(state(&log2, 1).state, AnaState::NonOptimized);
    assert_eq!(state(&log2, 2).nsids, vec![2]);
    let rgo = AnaLog::decode(&a1.log_page(lid::ANA, 1, 4096).data).unwrap();
    assert!(rgo.groups.iter().all(|g| g.nsids.is_empty()));

    // Ask for ANA change notices, hold an AER, then fail group 1 over on port 1.
    let aec = tessera_nvme::wire::command::SetFeatures {
        nsid: 0,
        save: false,
        feature: tessera_nvme::wire::command::Feature::AsyncEventConfig(1 << 11),
    };
    assert!(a1
        .command(aec.to_sqe(0), None, false, 0)
        .status()
        .is_success());
    let aer_cid = a1.send_capsule(Sqe::new(0x0c, 0), None, false, 0);
    let mut io = Client::io(f.addr(1), &a1, 1, HOST1, HOSTID1, false);
    assert!(io.read(1, 0, 1).status().is_success());
    f.server
        .set_ana_state(1, 1, AnaState::Inaccessible)
        .unwrap();
    let aen = a1.wait(aer_cid, &[], 0);
    assert_eq!(aen.cqe.dw0, 0x000c_0302, "notice, ANA change, log 0x0C");
    let read = io.read(1, 0, 1);
    assert_eq!(read.status().code(), Status::ANA_INACCESSIBLE.code());
    assert!(!read.status().dnr());
    assert!(
        io.read(2, 0, 1).status().is_success(),
        "group 2 stays accessible"
    );
    let log = AnaLog::decode(&a1.log_page(lid::ANA, 0, 4096).data).unwrap();
    assert_eq!(state(&log, 1).state, AnaState::Inaccessible);
    assert!(log.chgcnt > log1.chgcnt);
    f.server.set_ana_state(1, 1, AnaState::Optimized).unwrap();
    assert!(io.read(1, 0, 1).status().is_success());
}

#[test]
fn several_io_queues_and_pipelined_commands() {
    let f = Fixture::new();
    let admin = f.admin();
    let mut queues: Vec<Client> = (1..=3)
        .map(|qid| Client::io(f.addr(1), &admin, qid, HOST1, HOSTID1, false))
        .collect();
    for (i, q) in queues.iter_mut().enumerate() {
        let data = pattern(16 * 4096, i as u64);
        assert!(q
            .write(1, i as u64 * 16, &data, false)
            .status()
            .is_success());
    }
    // 16 reads in flight on one queue; completions may come in any order.
    let q = &mut queues[0];
    let cids: Vec<u16> = (0..16u64)
        .map(|i| {
            let rw = tessera_nvme::wire::command::ReadWrite::new(1, i, 1, false).unwrap();
            q.send_capsule(rw.to_sqe(io_opcode::READ, 0), None, false, 4096)
        })
        .collect();
    let mut data = std::collections::BTreeMap::new();
    let mut completed = 0;
    while completed < cids.len() {
        let pdu = q.next_pdu().unwrap();
        match pdu.header {
            tessera_nvme::wire::PduHeader::C2HData(h) => {
                data.insert(h.cccid, pdu.data);
            }
            tessera_nvme::wire::PduHeader::CapsuleResp(cqe) => {
                assert!(cqe.status.is_success());
                assert!(data.contains_key(&cqe.cid), "data precedes its completion");
                completed += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    let expected = pattern(16 * 4096, 0);
    for (i, cid) in cids.iter().enumerate() {
        assert_eq!(data[cid], expected[i * 4096..(i + 1) * 4096]);
    }
}

/// Reads of several sizes in flight together (on the connection's io_uring when the kernel
/// has one): each returns its own data, buffers reused from one round to the next carry no
/// stale data, a read out of range fails alone, and closing the connection with reads
/// still in flight leaves the server serving.
#[test]
fn pipelined_reads_of_mixed_sizes_and_close_with_reads_in_flight() {
    use tessera_nvme::wire::command::ReadWrite;
    use tessera_nvme::wire::PduHeader;
    let f = Fixture::new();
    let admin = f.admin();
    let mut q = Client::io(f.addr(1), &admin, 1, HOST1, HOSTID1, false);
    let image = pattern(64 * 4096, 7);
    assert!(q.write(1, 0, &image, false).status().is_success());
    let beyond = NS_BYTES / 4096;
    for round in 0..3u64 {
        // (slba, blocks); 31 commands fill the 32-entry queue.
        let reads: Vec<(u64, u32)> = (0..31u64)
            .map(|i| match i % 5 {
                0 => ((i + round) % 48, 16),
                1 if i == 11 => (beyond, 1),
                _ => ((i * 7 + round) % 64, 1),
            })
            .collect();
        let cids: Vec<u16> = reads
            .iter()
            .map(|&(slba, blocks)| {
                let rw = ReadWrite::new(1, slba, blocks, false).unwrap();
                let sqe = rw.to_sqe(io_opcode::READ, 0);
                q.send_capsule(sqe, None, false, blocks as usize * 4096)
            })
            .collect();
        let mut data = std::collections::BTreeMap::new();
        let mut status = std::collections::BTreeMap::new();
        while status.len() < cids.len() {
            let pdu = q.next_pdu().unwrap();
            match pdu.header {
                PduHeader::C2HData(h) => assert!(data.insert(h.cccid, pdu.data).is_none()),
                PduHeader::CapsuleResp(cqe) => {
                    assert!(status.insert(cqe.cid, cqe.status).is_none())
                }
                other => panic!("{other:?}"),
            }
        }
        for (&(slba, blocks), cid) in reads.iter().zip(&cids) {
            if slba == beyond {
                assert_eq!(status[cid].code(), Status::LBA_OUT_OF_RANGE.code());
                assert!(!data.contains_key(cid));
                continue;
            }
            assert!(
                status[cid].is_success(),
                "read {slba}+{blocks}: {:?}",
                status[cid]
            );
            let at = slba as usize * 4096;
            assert_eq!(
                data[cid],
                image[at..at + blocks as usize * 4096],
                "read {slba}+{blocks}"
            );
        }
    }
    for i in 0..31u64 {
        let rw = ReadWrite::new(1, i, 16, false).unwrap();
        q.send_capsule(rw.to_sqe(io_opcode::READ, 0), None, false, 16 * 4096);
    }
    drop(q);
    let mut q = Client::io(f.addr(1), &admin, 2, HOST1, HOSTID1, false);
    let done = q.read(1, 3, 2);
    assert!(done.status().is_success());
    assert_eq!(done.data, image[3 * 4096..5 * 4096]);
}

/// A read larger than one of the server's drive reads (256 KiB) comes back in order: its
/// C2HData PDUs follow each other without gap or overlap from offset 0, only the final one
/// carries LAST, there are no more of them than drive reads, and the bytes are those
/// written.
#[test]
fn a_large_read_arrives_in_order_in_at_most_one_pdu_per_drive_read() {
    use tessera_nvme::wire::command::ReadWrite;
    use tessera_nvme::wire::PduHeader;
    const DRIVE_READ_BYTES: usize = 256 << 10;
    let f = Fixture::new();
    let admin = f.admin();
    let mut q = Client::io(f.addr(1), &admin, 1, HOST1, HOSTID1, false);
    let image = pattern(1024 * 4096, 11);
    assert!(q.write(1, 0, &image, false).status().is_success());
    // MDTS exactly, and a size whose last drive read is partial.
    for blocks in [1024u32, 300] {
        let len = blocks as usize * 4096;
        let rw = ReadWrite::new(1, 0, blocks, false).unwrap();
        let cid = q.send_capsule(rw.to_sqe(io_opcode::READ, 0), None, false, len);
        let (mut received, mut pdus, mut last_seen) = (Vec::with_capacity(len), 0, false);
        loop {
            let pdu = q.next_pdu().unwrap();
            match pdu.header {
                PduHeader::C2HData(h) => {
                    assert_eq!(h.cccid, cid);
                    assert!(!last_seen, "C2HData after the one marked LAST");
                    assert_eq!(h.datao as usize, received.len(), "a gap or an overlap");
                    received.extend_from_slice(&pdu.data);
                    last_seen = h.last;
                    pdus += 1;
                }
                PduHeader::CapsuleResp(cqe) => {
                    assert_eq!(cqe.cid, cid);
                    assert!(cqe.status.is_success());
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(last_seen, "no C2HData marked LAST");
        assert!(
            pdus <= len.div_ceil(DRIVE_READ_BYTES),
            "{pdus} PDUs for {len} bytes"
        );
        assert!(
            received == image[..len],
            "read {blocks} blocks: wrong bytes"
        );
    }
    // The queue goes on serving.
    assert!(q.read(1, 0, 1).status().is_success());
}

/// Large reads sent together on one queue take turns at the drive (uring.rs,
/// `LARGE_READS_AT_DRIVE`): every one is answered whole, with its own bytes, and small
/// reads and writes sent among them are not held up behind them.
#[test]
fn large_reads_sent_together_take_turns_and_all_arrive_whole() {
    use std::collections::HashMap;
    use tessera_nvme::wire::command::ReadWrite;
    use tessera_nvme::wire::PduHeader;
    let f = Fixture::new();
    let admin = f.admin();
    let mut q = Client::io(f.addr(1), &admin, 1, HOST1, HOSTID1, false);
    let image = pattern(3072 * 4096, 12);
    for (k, part) in image.chunks(1024 * 4096).enumerate() {
        assert!(q
            .write(1, k as u64 * 1024, part, false)
            .status()
            .is_success());
    }
    // Six 4 MiB reads of different places, with a 4 KiB read among them.
    let mut wanted: HashMap<u16, (usize, usize)> = HashMap::new();
    for (i, slba) in [0u64, 1024, 2048, 512, 1536, 100].into_iter().enumerate() {
        let blocks = 1024u32.min(3072 - slba as u32);
        let len = blocks as usize * 4096;
        let rw = ReadWrite::new(1, slba, blocks, false).unwrap();
        let cid = q.send_capsule(rw.to_sqe(io_opcode::READ, 0), None, false, len);
        wanted.insert(cid, (slba as usize * 4096, len));
        if i == 2 {
            let rw = ReadWrite::new(1, 7, 1, false).unwrap();
            let cid = q.send_capsule(rw.to_sqe(io_opcode::READ, 0), None, false, 4096);
            wanted.insert(cid, (7 * 4096, 4096));
        }
    }
    let mut received: HashMap<u16, Vec<u8>> = HashMap::new();
    while !wanted.is_empty() {
        let pdu = q.next_pdu().unwrap();
        match pdu.header {
            PduHeader::C2HData(h) => {
                let got = received.entry(h.cccid).or_default();
                assert_eq!(
                    h.datao as usize,
                    got.len(),
                    "CID {}: a gap or an overlap",
                    h.cccid
                );
                got.extend_from_slice(&pdu.data);
                if h.success {
                    let (at, len) = wanted.remove(&h.cccid).expect("a read sent");
                    assert!(
                        got[..] == image[at..at + len],
                        "CID {}: wrong bytes",
                        h.cccid
                    );
                }
            }
            PduHeader::CapsuleResp(cqe) => {
                assert!(cqe.status.is_success(), "{cqe:?}");
                let (at, len) = wanted.remove(&cqe.cid).expect("a read sent");
                let got = received.remove(&cqe.cid).unwrap_or_default();
                assert!(
                    got[..] == image[at..at + len],
                    "CID {}: wrong bytes",
                    cqe.cid
                );
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(q.read(1, 0, 1).status().is_success());
}
