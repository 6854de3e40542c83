use proptest::prelude::*;

use super::*;

const SEED_EXAMPLE: &str = "\
%nsd: device=nvme0n1 nsd=de0704a01v1 usage=dataAndMetadata
failureGroup=704 pool=system thinDiskType=no
%nsd:
  device=/dev/dm-3
  nsd=d2 usage=dataOnly failureGroup=1 pool=data
";

fn nsd_err(text: &str) -> StanzaError {
    parse_nsd_stanzas(text).unwrap_err()
}

#[test]
fn seed_example() {
    let nsds = parse_nsd_stanzas(SEED_EXAMPLE).unwrap();
    assert_eq!(
        nsds,
        vec![
            NsdStanza {
                device: "nvme0n1".into(),
                nsd: Some("de0704a01v1".into()),
                usage: DiskUsage::DataAndMetadata,
                failure_group: 704,
                pool: "system".into(),
                thin_disk_type: ThinDiskType::No,
                servers: vec![],
                line: 1,
            },
            NsdStanza {
                device: "/dev/dm-3".into(),
                nsd: Some("d2".into()),
                usage: DiskUsage::DataOnly,
                failure_group: 1,
                pool: "data".into(),
                thin_disk_type: ThinDiskType::No,
                servers: vec![],
                line: 3,
            },
        ]
    );
}

#[test]
fn generic_parse_keeps_lines_and_comments_out() {
    let text = "# header comment\n\n%nsd: device=a # trailing\n  nsd=x\r\n%pdisk: name=p1\n";
    let stanzas = parse_stanzas(text).unwrap();
    assert_eq!(stanzas.len(), 2);
    assert_eq!(stanzas[0].kind, "nsd");
    assert_eq!(stanzas[0].line, 3);
    assert_eq!(
        stanzas[0].attrs,
        vec![
            Attr {
                key: "device".into(),
                value: "a".into(),
                line: 3
            },
            Attr {
                key: "nsd".into(),
                value: "x".into(),
                line: 4
            },
        ]
    );
    assert_eq!(stanzas[1].kind, "pdisk");
    assert_eq!(stanzas[1].get("name").unwrap().value, "p1");
}

#[test]
fn defaults_are_gpfs_defaults() {
    let nsds = parse_nsd_stanzas("%nsd: device=/dev/sdb").unwrap();
    let nsd = &nsds[0];
    assert_eq!(nsd.nsd, None);
    assert_eq!(nsd.usage, DiskUsage::DataAndMetadata);
    assert_eq!(nsd.failure_group, -1);
    assert_eq!(nsd.pool, "system");
    assert_eq!(nsd.thin_disk_type, ThinDiskType::No);
    assert!(nsd.servers.is_empty());
}

#[test]
fn other_known_kinds_are_skipped() {
    let text = "%pool: pool=data blockSize=4M\n%nsd: device=sdb pool=data\n%pdisk: x=y\n";
    assert_eq!(parse_nsd_stanzas(text).unwrap().len(), 1);
    let pools = parse_pool_stanzas(text).unwrap();
    assert_eq!(pools.len(), 1);
    assert_eq!(pools[0].block_size_bytes(), Some(4 << 20));
}

#[test]
fn error_unknown_usage() {
    let err = nsd_err("%nsd: device=sdb\n\n  usage=dataOnlyy\n");
    assert_eq!(
        err.to_string(),
        "line 3: usage=dataOnlyy: unknown usage; \
         use one of dataAndMetadata, dataOnly, metadataOnly, descOnly"
    );
    assert_eq!(err.line(), 3);
}

#[test]
fn error_attribute_without_equals() {
    let err = nsd_err("%nsd: device=sdb\nusage dataOnly\n");
    assert!(
        matches!(err, StanzaError::MissingEquals { line: 2, .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("line 2: `usage`: attribute without `=`"),
        "{err}"
    );
}

#[test]
fn error_empty_value_and_key() {
    let err = nsd_err("%nsd: device=sdb pool=\n");
    assert!(matches!(err, StanzaError::EmptyValue { line: 1, ref key } if key == "pool"));
    assert!(err.to_string().contains("empty value"), "{err}");
    let err = nsd_err("%nsd: device=sdb =x\n");
    assert!(
        matches!(err, StanzaError::EmptyKey { line: 1, .. }),
        "{err}"
    );
}

#[test]
fn error_duplicate_key() {
    let err = nsd_err("%nsd: device=sdb\n pool=a\n pool=b\n");
    assert_eq!(
        err,
        StanzaError::DuplicateKey {
            line: 3,
            key: "pool".into(),
            first_line: 2
        }
    );
    assert!(err.to_string().contains("first on line 2"), "{err}");
}

#[test]
fn error_attribute_before_header() {
    let err = nsd_err("# comment\ndevice=sdb\n%nsd: device=sdc\n");
    assert!(
        matches!(err, StanzaError::OutsideStanza { line: 2, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("`%nsd:`"), "{err}");
}

#[test]
fn error_bad_header_and_unknown_kind() {
    let err = nsd_err("%nsd device=sdb\n");
    assert!(
        matches!(err, StanzaError::BadHeader { line: 1, .. }),
        "{err}"
    );
    let err = nsd_err("%: device=sdb\n");
    assert!(
        matches!(err, StanzaError::BadHeader { line: 1, .. }),
        "{err}"
    );
    let err = nsd_err("%nsd: device=sdb\n%nds: device=sdc\n");
    assert!(
        matches!(err, StanzaError::UnknownKind { line: 2, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("use one of %nsd, %pool"), "{err}");
}

#[test]
fn error_unknown_key_lists_valid_keys() {
    let err = nsd_err("%nsd: device=sdb\n failuregroup=3\n");
    assert_eq!(
        err.to_string(),
        "line 2: failuregroup: unknown attribute of a %nsd stanza (keys are case-sensitive); \
         use one of device, nsd, usage, failureGroup, pool, thinDiskType, servers"
    );
}

#[test]
fn error_missing_device() {
    let err = nsd_err("%nsd: device=sdb\n%nsd:\n  nsd=d1\n");
    assert!(matches!(err, StanzaError::MissingKey { line: 2, ref key, .. } if key == "device"));
    assert!(err.to_string().contains("add device=/dev/nvme0n1"), "{err}");
}

#[test]
fn error_invalid_nsd_name() {
    for bad in ["1disk", "-v", "a/b", "a,b"] {
        let err = nsd_err(&format!("%nsd: device=sdb nsd={bad}"));
        assert!(matches!(err, StanzaError::InvalidValue { line: 1, ref key, .. } if key == "nsd"));
        assert!(err.to_string().contains("invalid NSD name"), "{err}");
        assert!(err.to_string().contains("starting with a letter"), "{err}");
    }
    let long = "a".repeat(256);
    let err = nsd_err(&format!("%nsd: device=sdb nsd={long}"));
    assert!(err.to_string().contains("longer than 255"), "{err}");
}

#[test]
fn error_bad_failure_group() {
    let err = nsd_err("%nsd: device=sdb failureGroup=x1");
    assert_eq!(
        err.to_string(),
        "line 1: failureGroup=x1: not an integer; \
         use an integer from -1 (no failure group) to 4000"
    );
    let err = nsd_err("%nsd: device=sdb failureGroup=4001");
    assert!(err.to_string().contains("out of range"), "{err}");
}

#[test]
fn error_bad_thin_disk_type() {
    let err = nsd_err("%nsd: device=sdb thinDiskType=STRIM");
    assert_eq!(
        err.to_string(),
        "line 1: thinDiskType=STRIM: unknown thinDiskType; use one of no, nvme, scsi, auto"
    );
}

#[test]
fn servers_are_kept_in_order_and_written_back() {
    let nsds = parse_nsd_stanzas("%nsd: device=sdb\n  servers=node2,node1").unwrap();
    assert_eq!(
        nsds[0].servers,
        vec!["node2".to_string(), "node1".to_string()]
    );
    let text = format_nsd_stanza(&nsds[0]);
    assert!(text.contains("servers=node2,node1"), "{text}");
    assert_eq!(
        parse_nsd_stanzas(&text).unwrap()[0].servers,
        nsds[0].servers
    );
}

#[test]
fn error_bad_servers() {
    for bad in ["a,,b", "a,a", "1,2,3,4,5,6,7,8,9", "a,b/c"] {
        let err = nsd_err(&format!("%nsd: device=sdb servers={bad}"));
        assert!(matches!(err, StanzaError::InvalidValue { ref key, .. } if key == "servers"));
        assert!(err.to_string().contains("separated by commas"), "{err}");
    }
}

#[test]
fn error_duplicate_nsd_name() {
    let err = nsd_err("%nsd: device=sdb nsd=d1\n%nsd: device=sdc\n  nsd=d1\n");
    assert_eq!(
        err,
        StanzaError::DuplicateNsd {
            line: 3,
            name: "d1".into(),
            first_line: 1
        }
    );
    assert!(err.to_string().contains("already used on line 1"), "{err}");
}

#[test]
fn error_duplicate_device_even_when_spelled_differently() {
    let err = nsd_err("%nsd: device=nvme0n1\n%nsd: device=/dev/nvme0n1\n");
    assert!(matches!(
        err,
        StanzaError::DuplicateDevice {
            line: 2,
            first_line: 1,
            ..
        }
    ));
    assert!(err.to_string().contains("list every device once"), "{err}");
}

#[test]
fn error_too_many_attributes() {
    let mut text = String::from("%vdisk:\n");
    for i in 0..=MAX_ATTRS_PER_STANZA {
        text += &format!("k{i}=v\n");
    }
    let err = parse_stanzas(&text).unwrap_err();
    assert!(matches!(err, StanzaError::TooManyAttrs { .. }), "{err}");
}

#[test]
fn pool_stanza_errors() {
    let err = parse_pool_stanzas("%pool: pool=data blockSize=3M").unwrap_err();
    assert!(err.to_string().contains("power of two"), "{err}");
    let err = parse_pool_stanzas("%pool: blockSize=4M").unwrap_err();
    assert!(matches!(err, StanzaError::MissingKey { .. }), "{err}");
    let err = parse_pool_stanzas("%pool: pool=a usage=descOnly").unwrap_err();
    assert!(err.to_string().contains("not pools"), "{err}");
    let err = parse_pool_stanzas("%pool: pool=a\n%pool: pool=a").unwrap_err();
    assert!(matches!(
        err,
        StanzaError::DuplicatePool {
            line: 2,
            first_line: 1,
            ..
        }
    ));
    let err = parse_pool_stanzas("%pool: pool=a layoutMap=round").unwrap_err();
    assert!(err.to_string().contains("scatter, cluster"), "{err}");
}

#[test]
fn block_sizes() {
    assert_eq!(parse_block_size("4M"), Ok(4 << 20));
    assert_eq!(parse_block_size("256k"), Ok(256 << 10));
    assert_eq!(parse_block_size("65536"), Ok(65536));
    assert!(parse_block_size("32M").is_err());
    assert!(parse_block_size("M").is_err());
    assert!(parse_block_size("99999999999999999999M").is_err());
}

#[test]
fn format_is_parsed_back() {
    let nsds = parse_nsd_stanzas(SEED_EXAMPLE).unwrap();
    let text: String = nsds.iter().map(format_nsd_stanza).collect();
    let again = parse_nsd_stanzas(&text).unwrap();
    assert_eq!(again.len(), 2);
    for (a, b) in nsds.iter().zip(&again) {
        assert_eq!(
            NsdStanza {
                line: b.line,
                ..a.clone()
            },
            *b
        );
    }
}

fn name() -> impl Strategy<Value = String> {
    "[A-Za-z_][A-Za-z0-9_.-]{0,24}"
}

fn nsd_stanza() -> impl Strategy<Value = NsdStanza> {
    (
        "(/dev/)?[a-z][a-z0-9-]{0,12}",
        proptest::option::of(name()),
        proptest::sample::select(DiskUsage::ALL.to_vec()),
        FAILURE_GROUP_MIN..=FAILURE_GROUP_MAX,
        name(),
        proptest::sample::select(ThinDiskType::ALL.to_vec()),
        // servers= is refused until NSD servers exist.
        proptest::collection::btree_set("[a-z0-9][a-z0-9.:_-]{0,10}", 0..=0),
    )
        .prop_map(
            |(device, nsd, usage, failure_group, pool, thin_disk_type, servers)| NsdStanza {
                device,
                nsd,
                usage,
                failure_group,
                pool,
                thin_disk_type,
                servers: servers.into_iter().collect(),
                line: 1,
            },
        )
}

fn pool_stanza() -> impl Strategy<Value = PoolStanza> {
    (
        name(),
        proptest::option::of(proptest::sample::select(vec![
            "4K", "64K", "256k", "1M", "16M",
        ])),
        proptest::option::of(proptest::sample::select(DiskUsage::ALL[..3].to_vec())),
        proptest::option::of(proptest::sample::select(vec![
            LayoutMap::Scatter,
            LayoutMap::Cluster,
        ])),
        proptest::option::of(any::<bool>()),
        proptest::option::of(0u32..=2),
        proptest::option::of(1u32..=1024),
    )
        .prop_map(|(pool, bs, usage, layout_map, awa, wad, bgf)| PoolStanza {
            pool,
            block_size: bs.map(str::to_string),
            usage,
            layout_map,
            allow_write_affinity: awa,
            write_affinity_depth: wad,
            block_group_factor: bgf,
            line: 1,
        })
}

fn pdisk_stanza() -> impl Strategy<Value = PdiskStanza> {
    (
        "(/dev/)?[a-z][a-z0-9-]{0,12}",
        name(),
        name(),
        1u32..=SLOT_MAX,
    )
        .prop_map(|(device, pdisk, enclosure, slot)| PdiskStanza {
            pdisk,
            device,
            enclosure,
            slot,
            line: 1,
        })
}

const PDISK_EXAMPLE: &str = "\
# two JBOFs, three drives each
%pdisk: pdisk=e1d1 device=/dev/nvme0n1 enclosure=jbof1 slot=1
%pdisk: device=/dev/nvme1n1 enclosure=jbof1
%pdisk:
  device=/var/tmp/d3
  enclosure=jbof2
  slot=7
%nsd: device=/dev/sdz nsd=other
";

#[test]
fn pdisk_stanzas_and_defaults() {
    let pdisks = parse_pdisk_stanzas(PDISK_EXAMPLE).unwrap();
    let summary: Vec<_> = pdisks
        .iter()
        .map(|p| {
            (
                p.pdisk.as_str(),
                p.device.as_str(),
                p.enclosure.as_str(),
                p.slot,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("e1d1", "/dev/nvme0n1", "jbof1", 1),
            ("jbof1s02", "/dev/nvme1n1", "jbof1", 2),
            ("jbof2s07", "/var/tmp/d3", "jbof2", 7),
        ]
    );
    // The %nsd stanza of the same file is left to the NSD parser.
    assert_eq!(parse_nsd_stanzas(PDISK_EXAMPLE).unwrap().len(), 1);
}

#[test]
fn pdisk_stanza_errors() {
    let err = |text: &str| parse_pdisk_stanzas(text).unwrap_err().to_string();
    assert_eq!(
        err("%pdisk: device=/dev/a"),
        "line 1: %pdisk stanza without enclosure=; add enclosure=jbof1"
    );
    assert_eq!(
        err("%pdisk: enclosure=e1"),
        "line 1: %pdisk stanza without device=; add device=/dev/nvme0n1"
    );
    assert!(err("%pdisk: device=/dev/a enclosure=e1 slot=0")
        .starts_with("line 1: slot=0: out of range; use an integer from 1 to 4096"));
    assert_eq!(
        err("%pdisk: device=/dev/a enclosure=e1 slot=3\n%pdisk: device=/dev/b enclosure=e1 slot=3"),
        "line 2: enclosure=e1 slot=3: slot already taken on line 1; \
         give every drive of an enclosure its own slot"
    );
    assert_eq!(
        err("%pdisk: device=/dev/a enclosure=e1 pdisk=p\n%pdisk: device=/dev/b enclosure=e2 pdisk=p"),
        "line 2: pdisk=p: pdisk name already used on line 1; give every pdisk its own name"
    );
    assert!(
        err("%pdisk: device=/dev/a enclosure=e1\n%pdisk: device=a enclosure=e2")
            .starts_with("line 2: device=a: device already used on line 1")
    );
    assert!(err("%pdisk: device=/dev/a enclosure=e1 da=DA1")
        .starts_with("line 1: da: unknown attribute of a %pdisk stanza"));
}

proptest! {
    #[test]
    fn nsd_format_parse_roundtrip(nsd in nsd_stanza()) {
        let text = format_nsd_stanza(&nsd);
        let parsed = parse_nsd_stanzas(&text).unwrap();
        prop_assert_eq!(parsed, vec![nsd]);
    }

    #[test]
    fn pool_format_parse_roundtrip(pool in pool_stanza()) {
        let text = format_pool_stanza(&pool);
        let parsed = parse_pool_stanzas(&text).unwrap();
        prop_assert_eq!(parsed, vec![pool]);
    }

    #[test]
    fn pdisk_format_parse_roundtrip(pdisk in pdisk_stanza()) {
        let text = format_pdisk_stanza(&pdisk);
        let parsed = parse_pdisk_stanzas(&text).unwrap();
        prop_assert_eq!(parsed, vec![pdisk]);
    }

    #[test]
    fn parse_never_panics_on_arbitrary_text(text in ".{0,400}") {
        check_no_panic(&text)?;
    }

    #[test]
    fn parse_never_panics_on_stanza_like_text(
        text in "([%:=#,\n\t ]|nsd|pool|pdisk|device|usage|enclosure|slot|failureGroup|servers|[a-z0-9/-]){0,120}"
    ) {
        check_no_panic(&text)?;
    }
}

/// Runs every parser on `text`; whatever they return, an error must start with its line.
fn check_no_panic(text: &str) -> Result<(), TestCaseError> {
    let results = [
        parse_stanzas(text).map(|_| ()),
        parse_nsd_stanzas(text).map(|_| ()),
        parse_pool_stanzas(text).map(|_| ()),
        parse_pdisk_stanzas(text).map(|_| ()),
    ];
    for err in results.into_iter().filter_map(Result::err) {
        let prefix = format!("line {}: ", err.line());
        prop_assert!(err.to_string().starts_with(&prefix), "{}", err);
        prop_assert!(err.line() >= 1 && err.line() <= text.lines().count());
    }
    Ok(())
}

#[test]
fn server_changes_name_an_nsd_and_its_servers_only() {
    let c =
        parse_nsd_servers_changes("%nsd: nsd=a servers=n2,n1\n%nsd:\n  nsd=b servers=n3").unwrap();
    assert_eq!(c.len(), 2);
    assert_eq!(
        (c[0].nsd.as_str(), c[0].servers.clone()),
        ("a", vec!["n2".to_string(), "n1".into()])
    );
    assert_eq!(c[1].line, 2);
    let e = parse_nsd_servers_changes("%nsd: nsd=a servers=n1 device=/dev/sdb").unwrap_err();
    assert!(e.to_string().contains("device"), "{e}");
    let e = parse_nsd_servers_changes("%nsd: nsd=a").unwrap_err();
    assert!(e.to_string().contains("servers"), "{e}");
    let e = parse_nsd_servers_changes("%nsd: nsd=a servers=x\n%nsd: nsd=a servers=y").unwrap_err();
    assert!(matches!(e, StanzaError::DuplicateNsd { .. }), "{e}");
    let e = parse_nsd_servers_changes("%pool: pool=p").unwrap_err();
    assert!(e.to_string().contains("only %nsd"), "{e}");
}
