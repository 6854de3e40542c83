//! The cluster secret file (format, permissions, atomic save) and join tokens, on real files.

use std::os::unix::fs::PermissionsExt;

use tessera_transport::{ClusterId, ClusterSecret, JoinToken, TransportError};

fn write_mode(path: &std::path::Path, text: &[u8], mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn secret_saves_with_mode_0600_and_loads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.secret");
    let secret = ClusterSecret::generate();
    secret.save(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.len(), 65);
    assert!(text.ends_with('\n'));
    assert!(text[..64]
        .chars()
        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    assert_eq!(ClusterSecret::load(&path).unwrap(), secret);
    // Saving again replaces the file atomically and leaves no temporary behind.
    let newer = ClusterSecret::generate();
    newer.save(&path).unwrap();
    assert_eq!(ClusterSecret::load(&path).unwrap(), newer);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    assert_ne!(secret, newer, "two generated secrets differ");
}

#[test]
fn secret_debug_shows_a_fingerprint_never_the_secret() {
    let secret = ClusterSecret::from_bytes([0xab; 32]);
    let debug = format!("{secret:?}");
    assert!(!debug.contains("abab"), "{debug}");
    assert!(debug.contains(&secret.fingerprint()), "{debug}");
    let token = JoinToken {
        cluster_id: ClusterId([1; 16]),
        cluster_name: "c".to_owned(),
        secret,
        contact: "h:1".to_owned(),
    };
    assert!(!format!("{token:?}").contains("abab"));
}

#[test]
fn secret_readable_by_group_or_others_is_refused_with_chmod_advice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.secret");
    let text = ClusterSecret::generate().to_file_text();
    for mode in [0o644, 0o640, 0o604, 0o660, 0o602, 0o620] {
        write_mode(&path, text.as_bytes(), mode);
        let error = ClusterSecret::load(&path).unwrap_err().to_string();
        assert!(
            error.contains(&format!("chmod 600 {}", path.display())),
            "{mode:o}: {error}"
        );
        assert!(error.contains(&format!("{mode:04o}")), "{error}");
    }
    for mode in [0o600, 0o400] {
        write_mode(&path, text.as_bytes(), mode);
        ClusterSecret::load(&path).expect("strict modes are fine");
    }
}

#[test]
fn malformed_secret_files_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.secret");
    let good = ClusterSecret::generate().to_file_text();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (Vec::new(), "0 hex digits"),
        (good.as_bytes()[..40].to_vec(), "40 hex digits"),
        (format!("{}00\n", &good[..64]).into_bytes(), "66 hex digits"),
        (
            good.to_uppercase().into_bytes(),
            "not a lower-case hex digit",
        ),
        (
            format!("{}\n\n", &good[..64]).into_bytes(),
            "more than one line",
        ),
        (format!(" {}", &good[..64]).into_bytes(), "position 1"),
        (vec![0xff, 0xfe, 0x00], "not UTF-8"),
        (vec![b'a'; 4096], "too large"),
    ];
    for (content, expected) in cases {
        write_mode(&path, &content, 0o600);
        let error = ClusterSecret::load(&path).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, TransportError::SecretFile { .. }), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains(expected), "{expected:?} not in {text}");
    }
    let missing = ClusterSecret::load(&dir.path().join("absent"))
        .unwrap_err()
        .to_string();
    assert!(missing.contains("join token"), "{missing}");
    let directory = ClusterSecret::load(dir.path()).unwrap_err().to_string();
    assert!(directory.contains("not a regular file"), "{directory}");
    // No trailing newline is fine too.
    write_mode(&path, &good.as_bytes()[..64], 0o600);
    ClusterSecret::load(&path).expect("newline is optional");
}

fn sample_token() -> JoinToken {
    JoinToken {
        cluster_id: ClusterId::generate(),
        cluster_name: "tessera.example.com".to_owned(),
        secret: ClusterSecret::generate(),
        contact: "node1.example.com:1191".to_owned(),
    }
}

#[test]
fn join_token_round_trips() {
    for contact in ["node1:1191", "10.0.0.1:7000", "[fe80::1]:7000", "x:65535"] {
        let token = JoinToken {
            contact: contact.to_owned(),
            ..sample_token()
        };
        let text = token.encode().unwrap();
        assert!(text.starts_with("tessera-join-1:"), "{text}");
        assert!(
            text.chars().all(|c| c.is_ascii_graphic()),
            "one printable line: {text}"
        );
        assert_eq!(JoinToken::parse(&text).unwrap(), token);
        assert_eq!(
            JoinToken::parse(&format!("  {text}\n")).unwrap(),
            token,
            "pasted"
        );
    }
}

#[test]
fn every_single_character_typo_in_a_token_is_caught() {
    let text = sample_token().encode().unwrap();
    let prefix = "tessera-join-1:".len();
    for at in prefix..text.len() {
        for replacement in ['0', '7', 'f', 'g', 'O'] {
            let mut damaged: Vec<char> = text.chars().collect();
            if damaged[at] == replacement {
                continue;
            }
            damaged[at] = replacement;
            let damaged: String = damaged.into_iter().collect();
            let error = JoinToken::parse(&damaged).unwrap_err();
            assert!(
                matches!(error, TransportError::TokenDamaged { .. }),
                "{at}: {error}"
            );
            assert!(error.to_string().contains("token damaged"), "{error}");
        }
    }
    for cut in [
        prefix,
        prefix + 1,
        prefix + 8,
        text.len() - 2,
        text.len() - 1,
    ] {
        let error = JoinToken::parse(&text[..cut]).unwrap_err();
        assert!(
            matches!(error, TransportError::TokenDamaged { .. }),
            "cut {cut}: {error}"
        );
    }
}

#[test]
fn other_texts_are_not_tokens_and_bad_fields_are_refused_at_encode() {
    let error = JoinToken::parse("hello").unwrap_err();
    assert!(matches!(error, TransportError::NotAToken { .. }), "{error}");
    let error = JoinToken::parse("tessera-join-2:00ff")
        .unwrap_err()
        .to_string();
    assert!(error.contains("version \"2\""), "{error}");
    for contact in [
        "nohost",
        "host:0",
        "host:99999",
        ":7000",
        "::1:7000",
        "a b:1",
    ] {
        let token = JoinToken {
            contact: contact.to_owned(),
            ..sample_token()
        };
        let error = token.encode().unwrap_err();
        assert!(
            matches!(error, TransportError::InvalidArgument { .. }),
            "{contact}: {error}"
        );
    }
    let token = JoinToken {
        cluster_name: String::new(),
        ..sample_token()
    };
    assert!(token.encode().is_err());
}
