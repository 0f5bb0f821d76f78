//! Quantities, durations, names and kinds.

use berth_api::{
    BerthDuration, CpuQuantity, FileMode, Kind, MaxAge, Quantity, Step, derive_name,
    display_name_key, slugify, validate_env_key, validate_name,
};

#[test]
fn quantities_parse() {
    let table: &[(&str, Option<u64>)] = &[
        ("4GiB", Some(4 << 30)),
        ("4Gi", Some(4 << 30)),
        ("512MiB", Some(512 << 20)),
        ("512Mi", Some(512 << 20)),
        ("20G", Some(20_000_000_000)),
        ("20GB", Some(20_000_000_000)),
        ("1000", Some(1000)),
        ("1000B", Some(1000)),
        ("1k", Some(1000)),
        ("1KiB", Some(1024)),
        ("1.5GiB", Some(3 << 29)),
        ("2TiB", Some(2 << 40)),
        ("0", Some(0)),
        (" 4GiB ", Some(4 << 30)),
        ("4 gigs", None),
        ("4 GiB", None),
        ("GiB", None),
        ("", None),
        ("-1", None),
        ("1.", None),
        (".5Gi", None),
        ("1.5", None),
        ("4gib", None),
        ("99999999999EiB", None),
    ];
    for (text, want) in table {
        let got = text.parse::<Quantity>().ok().map(|q| q.as_bytes());
        assert_eq!(got, *want, "{text:?}");
    }
    let err = "4 gigs".parse::<Quantity>().unwrap_err();
    assert_eq!(err.to_string(), "\"4 gigs\" is not a quantity");
}

#[test]
fn quantities_keep_the_users_form_and_compare_by_size() {
    let a: Quantity = "4GiB".parse().unwrap();
    let b: Quantity = "4Gi".parse().unwrap();
    assert_eq!(a, b);
    assert_eq!(a.to_string(), "4GiB");
    assert_eq!(serde_json::to_value(&b).unwrap(), serde_json::json!("4Gi"));
    let n: Quantity = serde_json::from_value(serde_json::json!(1000)).unwrap();
    assert_eq!(n.as_bytes(), 1000);
    assert_eq!(Quantity::from_bytes(7).to_string(), "7");
}

#[test]
fn cpu_quantities_parse() {
    let table: &[(&str, Option<u64>)] = &[
        ("2", Some(2000)),
        ("500m", Some(500)),
        ("1.5", Some(1500)),
        ("0.25", Some(250)),
        ("1.125", Some(1125)),
        ("1.0001", None),
        ("m", None),
        ("2 cpus", None),
        ("-1", None),
        ("1.5m", None),
        ("", None),
    ];
    for (text, want) in table {
        let got = text.parse::<CpuQuantity>().ok().map(|q| q.millis());
        assert_eq!(got, *want, "{text:?}");
    }
    let c: CpuQuantity = serde_json::from_value(serde_json::json!(2)).unwrap();
    assert_eq!(
        (c.millis(), c.to_string(), c.is_whole()),
        (2000, "2".into(), true)
    );
    let c: CpuQuantity = "1500m".parse().unwrap();
    assert_eq!((c.cpus_ceil(), c.is_whole()), (2, false));
}

#[test]
fn durations_parse() {
    let table: &[(&str, Option<u64>)] = &[
        ("30s", Some(30)),
        ("5m", Some(300)),
        ("2h", Some(7200)),
        ("30d", Some(30 * 86_400)),
        ("1h30m", Some(5400)),
        ("1w", Some(604_800)),
        ("0s", Some(0)),
        ("2 hours", None),
        ("2", None),
        ("h", None),
        ("1h30", None),
        ("1y", None),
        ("-5m", None),
        ("", None),
    ];
    for (text, want) in table {
        let got = text
            .parse::<BerthDuration>()
            .ok()
            .map(|d| d.as_std().as_secs());
        assert_eq!(got, *want, "{text:?}");
    }
    let d: BerthDuration = "1500ms".parse().unwrap();
    assert_eq!(d.as_std().as_millis(), 1500);
    assert_eq!(BerthDuration::from_secs(7200).to_string(), "2h");
    assert_eq!(BerthDuration::from_secs(90).to_string(), "90s");
    assert_eq!(BerthDuration::from_secs(30 * 86_400).to_string(), "30d");
    assert_eq!(
        "90m".parse::<BerthDuration>().unwrap(),
        "1h30m".parse().unwrap()
    );
}

#[test]
fn max_age_accepts_never() {
    assert_eq!("never".parse::<MaxAge>().unwrap(), MaxAge::Never);
    let m: MaxAge = "30d".parse().unwrap();
    assert_eq!(m.limit().map(|d| d.as_std().as_secs()), Some(30 * 86_400));
    assert_eq!(m.to_string(), "30d");
    assert!("sometime".parse::<MaxAge>().is_err());
    assert_eq!(
        serde_json::to_value(MaxAge::Never).unwrap(),
        serde_json::json!("never")
    );
}

#[test]
fn file_modes_are_octal() {
    let table: &[(&str, Option<u32>)] = &[
        ("0644", Some(0o644)),
        ("644", Some(0o644)),
        ("0755", Some(0o755)),
        ("0600", Some(0o600)),
        ("4755", Some(0o4755)),
        ("0o640", Some(0o640)),
        ("0888", None),
        ("rw-r--r--", None),
        ("77777", None),
        ("", None),
    ];
    for (text, want) in table {
        assert_eq!(
            text.parse::<FileMode>().ok().map(FileMode::bits),
            *want,
            "{text:?}"
        );
    }
    assert_eq!(FileMode::new(0o600).unwrap().to_string(), "0600");
}

#[test]
fn names_follow_dns_and_lxd_rules() {
    let good = ["a", "payments-api", "p2", "a-b-c", &"a".repeat(63)];
    for name in good {
        assert_eq!(validate_name(name), Ok(()), "{name:?}");
    }
    let bad = [
        "",
        "A",
        "1abc",
        "-abc",
        "abc-",
        "a_b",
        "a.b",
        "a b",
        "é",
        &"a".repeat(64),
    ];
    for name in bad {
        assert!(validate_name(name).is_err(), "{name:?} must be rejected");
    }
    assert_eq!(validate_name(""), Err("required".to_string()));
}

#[test]
fn slugify_table() {
    let table: &[(&str, Option<&str>)] = &[
        ("Payments API", Some("payments-api")),
        ("  Payments   API  ", Some("payments-api")),
        ("payments_api v2", Some("payments-api-v2")),
        ("Café Crème", Some("cafe-creme")),
        ("Straße", Some("strasse")),
        ("2024 Roadmap", Some("p-2024-roadmap")),
        ("--x--", Some("x")),
        ("!!!", None),
        ("", None),
        ("日本語", None),
        ("C++ / Rust", Some("c-rust")),
    ];
    for (display, want) in table {
        assert_eq!(slugify(display).as_deref(), *want, "{display:?}");
    }
    let long = "word ".repeat(30);
    let slug = slugify(&long).unwrap();
    assert!(slug.len() <= 63 && validate_name(&slug).is_ok(), "{slug}");
}

#[test]
fn derive_name_walks_past_clashes() {
    let taken = ["payments-api", "payments-api-2"];
    assert_eq!(
        derive_name("Payments API", |n| taken.contains(&n)).as_deref(),
        Some("payments-api-3")
    );
    assert_eq!(
        derive_name("Payments API", |_| false).as_deref(),
        Some("payments-api")
    );
    assert_eq!(derive_name("???", |_| false), None);
    assert_eq!(derive_name("x", |_| true), None);

    // A 63-character slug is shortened to make room for the suffix.
    let display = "a".repeat(70);
    let base = "a".repeat(63);
    let got = derive_name(&display, |n| n == base).unwrap();
    assert_eq!(got, format!("{}-2", "a".repeat(61)));
    // ... without leaving a '-' before the suffix.
    let display = format!("{}-bc", "a".repeat(60));
    let got = derive_name(&display, |n| n.len() == 63).unwrap();
    assert_eq!(got, format!("{}-2", "a".repeat(60)));
    assert!(validate_name(&got).is_ok());
}

#[test]
fn display_name_keys_ignore_case_and_outer_space() {
    assert_eq!(display_name_key("  Payments API "), "payments api");
    assert_eq!(
        display_name_key("PAYMENTS api"),
        display_name_key("payments API")
    );
}

#[test]
fn env_keys() {
    for key in ["PORT", "_x", "NODE_ENV", "a1"] {
        assert_eq!(validate_env_key(key), Ok(()), "{key}");
    }
    for key in ["", "1A", "A-B", "A B", "Ä"] {
        assert!(validate_env_key(key).is_err(), "{key:?}");
    }
}

#[test]
fn kinds_parse_like_kubectl() {
    let table: &[(&str, Option<Kind>)] = &[
        ("project", Some(Kind::Project)),
        ("projects", Some(Kind::Project)),
        ("Project", Some(Kind::Project)),
        ("PROJECTS", Some(Kind::Project)),
        ("agentprofile", Some(Kind::AgentProfile)),
        ("agentprofiles", Some(Kind::AgentProfile)),
        ("AgentProfile", Some(Kind::AgentProfile)),
        ("gitsource", Some(Kind::GitSource)),
        ("gitsources", Some(Kind::GitSource)),
        ("pod", None),
        ("", None),
    ];
    for (text, want) in table {
        assert_eq!(Kind::parse(text), *want, "{text:?}");
    }
    for kind in Kind::ALL {
        assert_eq!(Kind::parse(kind.as_str()), Some(kind));
        assert_eq!(Kind::parse(kind.plural()), Some(kind));
        assert_eq!(kind.list_kind(), format!("{}List", kind.as_str()));
    }
}

#[test]
fn kinds_from_the_command_line() {
    let table: &[(&str, Option<Kind>)] = &[
        ("project", Some(Kind::Project)),
        ("projects", Some(Kind::Project)),
        ("Project", Some(Kind::Project)),
        ("Projects", Some(Kind::Project)),
        ("proj", Some(Kind::Project)),
        ("PROJ", Some(Kind::Project)),
        ("agentprofile", Some(Kind::AgentProfile)),
        ("agentprofiles", Some(Kind::AgentProfile)),
        ("AgentProfile", Some(Kind::AgentProfile)),
        ("ap", Some(Kind::AgentProfile)),
        ("gitsource", Some(Kind::GitSource)),
        ("gitsources", Some(Kind::GitSource)),
        ("GitSource", Some(Kind::GitSource)),
        ("gs", Some(Kind::GitSource)),
        ("pods", None),
        ("projs", None),
        (" project", None),
        ("", None),
    ];
    for (word, want) in table {
        assert_eq!(Kind::from_cli(word).ok(), *want, "{word:?}");
    }
    assert_eq!(
        Kind::from_cli("widgets").unwrap_err().to_string(),
        "unknown kind \"widgets\" (expected project, agentprofile or gitsource)"
    );
}

#[test]
fn kinds_have_the_names_api_resources_lists() {
    // NAME, SHORTNAMES, KIND, as `kubectl api-resources` prints them, and the singular.
    let table = [
        (Kind::Project, "projects", "proj", "Project", "project"),
        (
            Kind::AgentProfile,
            "agentprofiles",
            "ap",
            "AgentProfile",
            "agentprofile",
        ),
        (
            Kind::GitSource,
            "gitsources",
            "gs",
            "GitSource",
            "gitsource",
        ),
    ];
    assert_eq!(Kind::LISTED, table.map(|row| row.0));
    for (kind, plural, short, name, singular) in table {
        assert_eq!(
            (kind.plural(), kind.short(), kind.as_str(), kind.singular()),
            (plural, short, name, singular)
        );
        assert_eq!(Kind::from_plural(plural), Some(kind));
        assert_eq!(name.parse::<Kind>(), Ok(kind));
    }
    // An API path names a kind by its plural exactly: no other spelling routes.
    for segment in ["proj", "project", "Projects", "gs", "ap"] {
        assert_eq!(Kind::from_plural(segment), None, "{segment}");
    }
}

#[test]
fn steps_are_ordered_like_the_pipeline() {
    let mut step = Step::Requested;
    let mut seen = vec![step];
    while let Some(next) = step.next() {
        assert!(next > step);
        seen.push(next);
        step = next;
    }
    assert_eq!(seen, Step::ALL.to_vec());
    assert_eq!(Step::Briefed.next(), None);
    assert_eq!(Step::parse("CheckedOut"), Some(Step::CheckedOut));
    assert_eq!(
        serde_json::to_value(Step::RunnerStarted).unwrap(),
        serde_json::json!("RunnerStarted")
    );
}
