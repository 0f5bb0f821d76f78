use super::*;

#[test]
fn quoting_survives_single_quotes() {
    assert_eq!(shell_quote("it's"), r"'it'\''s'");
    assert_eq!(shell_quote(""), "''");
}

#[test]
fn unconnected_inspector_is_not_ready_and_says_where_it_looked() {
    let inspector = Inspector::new("unix:///nowhere.socket", "c1", None, Default::default());
    let reason = inspector.reachability().unwrap_err();
    assert!(reason.contains("unix:///nowhere.socket"), "{reason}");
    assert!(inspector.runtime().is_none());
}

#[test]
fn a_connected_inspector_is_ready_until_a_probe_says_otherwise() {
    let fake: Arc<dyn Runtime> = Arc::new(crate::testing::fake_runtime::FakeRuntime::new());
    let lxd = Arc::new(RuntimeHandle::ready(fake));
    let inspector = Inspector::new("unix:///lxd.socket", "c1", Some(lxd), Default::default());
    assert!(inspector.runtime().is_some());
    assert_eq!(inspector.reachability(), Ok(()));
    inspector.set_reachability(Err("LXD did not answer".into()));
    assert_eq!(inspector.reachability(), Err("LXD did not answer".into()));
}
