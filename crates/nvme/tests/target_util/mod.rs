//! A minimal, test-only NVMe/TCP host built directly on `wire`, and helpers that start a
//! drive server on files in a temporary directory. It does what Linux `nvme-tcp` does on
//! the wire (ICReq, Connect with in-capsule data, PSDT=01 SGLs, R2T/H2CData honouring
//! MAXH2CDATA) and nothing more, so the server is tested against the protocol rather than
//! against the host library being written at the same time.
#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use tessera_nvme::target::{DriveServer, TargetConfig};
use tessera_nvme::wire::command::{
    cns, io_opcode, DatasetManagement, DsmRange, GetLogPage, Identify, IoCommand, ReadWrite,
};
use tessera_nvme::wire::fabrics::{
    property, Connect, ConnectData, PropertyGet, PropertySet, PropertySize, CNTLID_DYNAMIC,
};
use tessera_nvme::wire::pdu::{IcReq, PduHeader};
use tessera_nvme::wire::{
    Cqe, DataHeader, DigestConfig, IcResp, Nqn, Pdu, PduError, PduReader, SglDescriptor, Side, Sqe,
    Status,
};

pub const SUBNQN: &str = "nqn.2024-01.io.tessera:jbof1";
pub const HOST1: &str = "nqn.2024-01.io.tessera:node1";
pub const HOST2: &str = "nqn.2024-01.io.tessera:node2";
pub const HOST_DENIED: &str = "nqn.2024-01.io.tessera:intruder";
pub const HOSTID1: [u8; 16] = [0x11; 16];
pub const HOSTID2: [u8; 16] = [0x22; 16];
pub const NS_BYTES: u64 = 64 << 20;

/// A server on two ports (1: group 1 optimized, 2: group 1 non-optimized) exporting one
/// subsystem with two namespaces backed by files.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub server: DriveServer,
}

pub fn config_json(dir: &std::path::Path, tessera: &str) -> String {
    let mut paths = Vec::new();
    for i in 1..=2 {
        let p: PathBuf = dir.join(format!("d{i}"));
        std::fs::File::create(&p)
            .unwrap()
            .set_len(NS_BYTES)
            .unwrap();
        paths.push(p.display().to_string());
    }
    format!(
        r#"{{
      "hosts": [{{"nqn": "{HOST1}"}}, {{"nqn": "{HOST2}"}}],
      "ports": [
        {{"portid": 1, "addr": {{"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "0"}},
          "subsystems": ["{SUBNQN}"],
          "ana_groups": [{{"grpid": 1, "ana": {{"state": "optimized"}}}},
                         {{"grpid": 2, "ana": {{"state": "optimized"}}}}],
          "referrals": []}},
        {{"portid": 2, "addr": {{"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "0"}},
          "param": {{"inline_data_size": "8192"}},
          "subsystems": ["{SUBNQN}"],
          "ana_groups": [{{"grpid": 1, "ana": {{"state": "non-optimized"}}}}]}}
      ],
      "subsystems": [{{
        "nqn": "{SUBNQN}",
        "attr": {{"allow_any_host": "0", "serial": "JBOF1"}},
        "allowed_hosts": ["{HOST1}", "{HOST2}"],
        "namespaces": [
          {{"nsid": 1, "enable": 1, "device": {{"path": "{}"}}, "ana_grpid": 1}},
          {{"nsid": 2, "enable": 1, "device": {{"path": "{}"}}, "ana_grpid": 2}}
        ]
      }}]
      {tessera}
    }}"#,
        paths[0], paths[1]
    )
}

impl Fixture {
    pub fn new() -> Fixture {
        Fixture::with_tessera("")
    }

    /// `tessera` is appended inside the top-level object, e.g.
    /// `, "tessera": {"maxh2cdata_bytes": 16384}`.
    pub fn with_tessera(tessera: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let json = config_json(dir.path(), tessera);
        let config = TargetConfig::from_json_str(&json).unwrap();
        let server = DriveServer::start(config).unwrap();
        Fixture { dir, server }
    }

    pub fn addr(&self, portid: u16) -> SocketAddr {
        self.server.local_addr(portid).unwrap()
    }

    /// An enabled admin queue of HOST1 on port 1 for the jbof subsystem.
    pub fn admin(&self) -> Client {
        Client::admin(self.addr(1), SUBNQN, HOST1, HOSTID1, 0, false)
    }
}

pub struct Client {
    pub stream: TcpStream,
    pub reader: PduReader,
    pub send: DigestConfig,
    pub maxh2cdata: u32,
    pub cntlid: u16,
    next_cid: u16,
}

/// The response to one command: completion and any C2H data.
#[derive(Debug)]
pub struct Done {
    pub cqe: Cqe,
    pub data: Vec<u8>,
}

impl Done {
    pub fn status(&self) -> Status {
        self.cqe.status
    }
}

impl Client {
    /// TCP connect and ICReq/ICResp with the digests given.
    pub fn handshake(addr: SocketAddr, digests: bool) -> Client {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        let icreq = IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: digests,
            ddgst: digests,
            maxr2t: 0,
        };
        Pdu::new(PduHeader::IcReq(icreq))
            .write_to(&mut stream, &DigestConfig::NONE)
            .unwrap();
        // An MDTS-sized read can arrive as one C2HData PDU (as from Linux's nvmet): its
        // data plus room for the header, as the host itself accepts.
        let mut reader = PduReader::new(Side::Host, (4 << 20) + 4096, DigestConfig::NONE);
        let pdu = reader.read_pdu(&mut stream).unwrap();
        let PduHeader::IcResp(resp) = pdu.header else {
            panic!("expected ICResp, got {:?}", pdu.header)
        };
        let s = DigestConfig::after_handshake(&icreq, &resp, Side::Host);
        reader.set_digests(s.receive);
        check_icresp(&resp, digests);
        Client {
            stream,
            reader,
            send: s.send,
            maxh2cdata: resp.maxh2cdata,
            cntlid: 0,
            next_cid: 1,
        }
    }

    /// Handshake, admin Connect, CC.EN=1; panics unless all succeed.
    pub fn admin(
        addr: SocketAddr,
        subnqn: &str,
        hostnqn: &str,
        hostid: [u8; 16],
        kato_ms: u32,
        digests: bool,
    ) -> Client {
        let mut c = Client::handshake(addr, digests);
        let done = c.connect(0, CNTLID_DYNAMIC, subnqn, hostnqn, hostid, kato_ms);
        assert!(
            done.status().is_success(),
            "admin connect: {:?}",
            done.status()
        );
        c.cntlid = done.cqe.dw0 as u16;
        c.enable();
        c
    }

    /// An I/O queue of the controller `admin` belongs to (in subsystem [`SUBNQN`]).
    pub fn io(
        addr: SocketAddr,
        admin: &Client,
        qid: u16,
        hostnqn: &str,
        hostid: [u8; 16],
        digests: bool,
    ) -> Client {
        Client::io_in(addr, SUBNQN, admin, qid, (hostnqn, hostid), digests)
    }

    /// An I/O queue of the controller `admin` belongs to, in subsystem `subnqn`.
    pub fn io_in(
        addr: SocketAddr,
        subnqn: &str,
        admin: &Client,
        qid: u16,
        (hostnqn, hostid): (&str, [u8; 16]),
        digests: bool,
    ) -> Client {
        let mut c = Client::handshake(addr, digests);
        let done = c.connect(qid, admin.cntlid, subnqn, hostnqn, hostid, 0);
        assert!(
            done.status().is_success(),
            "io connect: {:?}",
            done.status()
        );
        c.cntlid = admin.cntlid;
        c
    }

    pub fn connect(
        &mut self,
        qid: u16,
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
        hostid: [u8; 16],
        kato_ms: u32,
    ) -> Done {
        let sqe = Connect::new(qid, 32, kato_ms).unwrap().to_sqe(0);
        let data = ConnectData {
            hostid,
            cntlid,
            subnqn: Nqn::new(subnqn).unwrap(),
            hostnqn: Nqn::new(hostnqn).unwrap(),
        }
        .encode();
        self.command(sqe, Some(&data), true, 0)
    }

    pub fn enable(&mut self) {
        let set = PropertySet {
            size: PropertySize::Four,
            offset: property::CC,
            value: 1 | 6 << 16 | 4 << 20,
        };
        assert!(self
            .command(set.to_sqe(0), None, false, 0)
            .status()
            .is_success());
        let get = PropertyGet {
            size: PropertySize::Four,
            offset: property::CSTS,
        };
        let done = self.command(get.to_sqe(0), None, false, 0);
        assert_eq!(done.cqe.dw0 & 1, 1, "CSTS.RDY");
    }

    pub fn identify(&mut self, cns_value: u8, nsid: u32) -> Done {
        let id = Identify {
            nsid,
            cns: cns_value,
            cntid: 0,
            csi: 0,
        };
        self.command(id.to_sqe(0), None, false, 4096)
    }

    pub fn log_page(&mut self, lid: u8, lsp: u8, len: u64) -> Done {
        let mut glp = GetLogPage::new(0xffff_ffff, lid, 0, len).unwrap();
        glp.lsp = lsp;
        self.command(glp.to_sqe(0), None, false, len as usize)
    }

    pub fn write(&mut self, nsid: u32, slba: u64, data: &[u8], in_capsule: bool) -> Done {
        let blocks = (data.len() / 4096) as u32;
        let sqe = ReadWrite::new(nsid, slba, blocks, false)
            .unwrap()
            .to_sqe(io_opcode::WRITE, 0);
        self.command(sqe, Some(data), in_capsule, 0)
    }

    /// Dataset Management with AD for one range, its descriptor in the capsule.
    pub fn deallocate(&mut self, nsid: u32, slba: u64, blocks: u32) -> Done {
        let ranges = DsmRange::encode_list(&[DsmRange {
            context_attributes: 0,
            nlb: blocks,
            slba,
        }]);
        let dsm = IoCommand::DatasetManagement(DatasetManagement {
            nsid,
            nr: 0,
            idr: false,
            idw: false,
            deallocate: true,
        });
        self.command(dsm.to_sqe(0), Some(&ranges), true, 0)
    }

    pub fn read(&mut self, nsid: u32, slba: u64, blocks: u32) -> Done {
        let sqe = ReadWrite::new(nsid, slba, blocks, false)
            .unwrap()
            .to_sqe(io_opcode::READ, 0);
        self.command(sqe, None, false, blocks as usize * 4096)
    }

    fn take_cid(&mut self) -> u16 {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        cid
    }

    /// Sends a command capsule; `data_out` goes in the capsule when `in_capsule`, else it
    /// is announced with a transport SGL and sent when the target asks with R2T.
    pub fn send_capsule(
        &mut self,
        mut sqe: Sqe,
        data_out: Option<&[u8]>,
        in_capsule: bool,
        data_in: usize,
    ) -> u16 {
        sqe.cid = self.take_cid();
        sqe.flags = 0x40;
        let out_len = data_out.map_or(0, <[u8]>::len) as u32;
        sqe.dptr = match (data_out, in_capsule) {
            (Some(_), true) => SglDescriptor::in_capsule(0, out_len),
            (Some(_), false) => SglDescriptor::transport(out_len),
            (None, _) => SglDescriptor::transport(data_in as u32),
        };
        let capsule = if in_capsule {
            data_out.unwrap_or(&[])
        } else {
            &[]
        };
        let pdu = Pdu {
            header: PduHeader::CapsuleCmd(sqe),
            data: capsule.to_vec(),
        };
        pdu.write_to(&mut self.stream, &self.send).unwrap();
        sqe.cid
    }

    /// Sends a command and serves R2Ts until its completion arrives.
    pub fn command(
        &mut self,
        sqe: Sqe,
        data_out: Option<&[u8]>,
        in_capsule: bool,
        data_in: usize,
    ) -> Done {
        let cid = self.send_capsule(sqe, data_out, in_capsule, data_in);
        self.wait(cid, data_out.unwrap_or(&[]), data_in)
    }

    pub fn wait(&mut self, cid: u16, data_out: &[u8], data_in: usize) -> Done {
        let mut data = vec![0u8; data_in];
        loop {
            let pdu = self.reader.read_pdu(&mut self.stream).unwrap();
            match pdu.header {
                PduHeader::R2T(r2t) => {
                    assert_eq!(r2t.cccid, cid);
                    assert!(r2t.r2tl <= self.maxh2cdata);
                    let (start, end) = (r2t.r2to as usize, (r2t.r2to + r2t.r2tl) as usize);
                    self.send_h2c(cid, r2t.ttag, start, &data_out[start..end]);
                }
                PduHeader::C2HData(h) => {
                    assert_eq!(h.cccid, cid);
                    let at = h.datao as usize;
                    data[at..at + pdu.data.len()].copy_from_slice(&pdu.data);
                }
                PduHeader::CapsuleResp(cqe) if cqe.cid == cid => return Done { cqe, data },
                other => panic!("unexpected PDU {other:?}"),
            }
        }
    }

    pub fn send_h2c(&mut self, cid: u16, ttag: u16, offset: usize, chunk: &[u8]) {
        let header = PduHeader::H2CData(DataHeader::h2c(
            cid,
            ttag,
            offset as u32,
            chunk.len() as u32,
            true,
        ));
        let pdu = Pdu {
            header,
            data: chunk.to_vec(),
        };
        pdu.write_to(&mut self.stream, &self.send).unwrap();
    }

    /// Reads the next PDU (for tests that look at TermReqs and closed streams).
    pub fn next_pdu(&mut self) -> Result<Pdu, PduError> {
        self.reader.read_pdu(&mut self.stream)
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }
}

fn check_icresp(resp: &IcResp, digests: bool) {
    assert_eq!((resp.pfv, resp.cpda), (0, 0));
    assert_eq!((resp.hdgst, resp.ddgst), (digests, digests));
    assert!(resp.maxh2cdata >= 4096);
}

/// Deterministic pseudo-random test bytes (not every test binary of this crate uses them).
#[allow(unused_imports)]
pub use tessera_testkit::pattern;

pub fn identify_cns() -> (u8, u8, u8, u8) {
    (
        cns::NAMESPACE,
        cns::CONTROLLER,
        cns::ACTIVE_NAMESPACES,
        cns::NS_ID_DESCRIPTORS,
    )
}
