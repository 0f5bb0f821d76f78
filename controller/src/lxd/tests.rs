//! The client against recorded LXD 5.0.2 responses, replayed by a stub HTTP server on a unix
//! socket: error mapping (404, failure inside an operation, 412, frozen exec), operation waits,
//! exec output files, the project parameter and the request observer.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use super::transport::{RawResponse, parse_envelope};
use super::{Endpoint, LxdClient, LxdConfig, RequestObserver};
use crate::runtime::{CreateInstance, Created, ExecRequest, ImageSource, Runtime, RuntimeError};

const SERVER: &str = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{"api_extensions":["instances"],"auth":"trusted","environment":{"server_version":"5.0.2","server_clustered":false,"server_name":"none"}}}"#;
const NOT_FOUND: &str = r#"{"type":"error","status":"","status_code":0,"operation":"","error_code":404,"error":"Instance not found","metadata":null}"#;
const OP_NOT_FOUND: &str = r#"{"type":"error","status":"","status_code":0,"operation":"","error_code":404,"error":"Operation not found","metadata":null}"#;
const CREATE_ASYNC: &str = r#"{"type":"async","status":"Operation created","status_code":100,"operation":"/1.0/operations/8087e527-71e7-428a-9d5f-6f3eea8487f8","error_code":0,"error":"","metadata":{"id":"8087e527-71e7-428a-9d5f-6f3eea8487f8","class":"task","description":"Creating instance","status":"Running","status_code":103,"resources":{"instances":["/1.0/instances/web"]},"metadata":null,"may_cancel":false,"err":"","location":"none"}}"#;
const CREATE_DUPLICATE: &str = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{"id":"8087e527-71e7-428a-9d5f-6f3eea8487f8","class":"task","description":"Creating instance","status":"Failure","status_code":400,"resources":{"instances":["/1.0/instances/web"]},"metadata":null,"may_cancel":false,"err":"Failed creating instance record: Add instance info to the database: This \"instances\" entry already exists","location":"none"}}"#;
const ETAG_MISMATCH: &str = r#"{"type":"error","status":"","status_code":0,"operation":"","error_code":412,"error":"ETag doesn't match: 64d9ee vs deadbeef","metadata":null}"#;
const FROZEN: &str = r#"{"type":"error","status":"","status_code":0,"operation":"","error_code":400,"error":"Instance is frozen","metadata":null}"#;
const EXEC_ASYNC: &str = r#"{"type":"async","status":"Operation created","status_code":100,"operation":"/1.0/operations/389e3646-50da-4239-b129-81b978bf2bb2","error_code":0,"error":"","metadata":{"id":"389e3646-50da-4239-b129-81b978bf2bb2","status":"Running","status_code":103,"err":""}}"#;
const EXEC_DONE: &str = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{"id":"389e3646-50da-4239-b129-81b978bf2bb2","class":"task","description":"Executing command","status":"Success","status_code":200,"metadata":{"output":{"1":"/1.0/instances/web/logs/exec_389e3646.stdout","2":"/1.0/instances/web/logs/exec_389e3646.stderr"},"return":2},"may_cancel":false,"err":"","location":"none"}}"#;
const EXEC_RUNNING: &str = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{"id":"389e3646-50da-4239-b129-81b978bf2bb2","status":"Running","status_code":103,"metadata":null,"err":""}}"#;
const INSTANCE: &str = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{"architecture":"x86_64","config":{"volatile.base_image":"abc","user.berth.uid":"u1"},"devices":{"scratch":{"type":"disk","source":"/tmp","path":"/mnt"}},"ephemeral":false,"profiles":["default"],"stateful":false,"description":"","created_at":"2026-11-30T05:53:57Z","last_used_at":"0001-01-01T00:00:00Z","name":"web","status":"Stopped","status_code":102,"location":"none"}}"#;
const UPDATE_ASYNC: &str = r#"{"type":"async","status":"Operation created","status_code":100,"operation":"/1.0/operations/11111111-2222-3333-4444-555555555555","error_code":0,"error":"","metadata":{"id":"11111111-2222-3333-4444-555555555555","status":"Running"}}"#;
const UPDATE_DONE: &str = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{"id":"11111111-2222-3333-4444-555555555555","status":"Success","status_code":200,"err":""}}"#;
const EMPTY_SYNC: &str = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{}}"#;

type Reply = (u16, Vec<(&'static str, &'static str)>, &'static str);

/// A reply code that makes the stub close the connection without answering, as LXD does when
/// it is overloaded.
const DROP: u16 = 0;

/// Scripted replies per `METHOD path`; the last reply of a route repeats.
#[derive(Default)]
struct Recorded {
    routes: Mutex<Vec<(String, VecDeque<Reply>)>>,
    /// `METHOD path?query` plus the If-Match header when present, in arrival order.
    seen: Mutex<Vec<String>>,
}

impl Recorded {
    fn route(&self, method_path: &str, replies: Vec<Reply>) {
        self.routes
            .lock()
            .unwrap()
            .push((method_path.to_string(), replies.into()));
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    fn answer(&self, method: &str, path: &str) -> Reply {
        let key = format!("{method} {path}");
        let mut routes = self.routes.lock().unwrap();
        match routes.iter_mut().find(|(k, _)| *k == key) {
            Some((_, replies)) if replies.len() > 1 => replies.pop_front().unwrap(),
            Some((_, replies)) => replies.front().cloned().unwrap(),
            None => (404, vec![], NOT_FOUND),
        }
    }
}

fn ok(body: &'static str) -> Reply {
    (200, vec![], body)
}

fn status(code: u16, body: &'static str) -> Reply {
    (code, vec![], body)
}

/// Starts the stub on a socket in a fresh directory and connects a client to it.
async fn stub(recorded: Arc<Recorded>) -> (LxdClient, tempfile::TempDir) {
    recorded.route("GET /1.0", vec![ok(SERVER)]);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("lxd.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let recorded = Arc::clone(&recorded);
            tokio::spawn(async move {
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let recorded = Arc::clone(&recorded);
                    async move {
                        let if_match = req
                            .headers()
                            .get("if-match")
                            .and_then(|v| v.to_str().ok())
                            .map(|v| format!(" if-match={v}"))
                            .unwrap_or_default();
                        let uri = req.uri().clone();
                        recorded.seen.lock().unwrap().push(format!(
                            "{} {}?{}{if_match}",
                            req.method(),
                            uri.path(),
                            uri.query().unwrap_or("")
                        ));
                        let (code, headers, body) =
                            recorded.answer(req.method().as_str(), uri.path());
                        if code == DROP {
                            return Err("the connection is dropped unanswered");
                        }
                        let mut response = hyper::Response::builder().status(code);
                        for (k, v) in headers {
                            response = response.header(k, v);
                        }
                        Ok::<_, &'static str>(
                            response
                                .body(Full::new(Bytes::from_static(body.as_bytes())))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let mut config = LxdConfig::new(Endpoint::Unix(socket));
    config.project = "berth-proj".into();
    config.request_timeout = Duration::from_secs(5);
    let observer = Arc::new(Counting::default());
    config.observer = Some(observer);
    (LxdClient::connect(config).await.unwrap(), dir)
}

#[derive(Default)]
struct Counting(Mutex<Vec<(String, u16)>>);

impl RequestObserver for Counting {
    fn observe(&self, method: &str, code: u16, seconds: f64) {
        assert!(seconds >= 0.0);
        self.0.lock().unwrap().push((method.to_string(), code));
    }
}

fn create_request() -> CreateInstance {
    CreateInstance {
        name: "web".into(),
        image: ImageSource::Alias("berth-tiny".into()),
        config: Default::default(),
        devices: Default::default(),
        profiles: Vec::new(),
        target: None,
        known_absent: false,
    }
}

#[tokio::test]
async fn missing_instance_is_none_and_every_call_carries_the_project() {
    let recorded = Arc::new(Recorded::default());
    let (client, _dir) = stub(Arc::clone(&recorded)).await;
    assert!(client.get_instance("web").await.unwrap().is_none());
    assert_eq!(client.server().version, "5.0.2");
    for call in recorded.seen() {
        assert!(call.contains("project=berth-proj"), "{call}");
    }
}

#[tokio::test]
async fn duplicate_name_fails_inside_the_operation() {
    let recorded = Arc::new(Recorded::default());
    recorded.route("POST /1.0/instances", vec![status(202, CREATE_ASYNC)]);
    recorded.route(
        "GET /1.0/operations/8087e527-71e7-428a-9d5f-6f3eea8487f8/wait",
        vec![ok(CREATE_DUPLICATE)],
    );
    let (client, _dir) = stub(Arc::clone(&recorded)).await;
    let Created::Submitted { operation } = client.create_instance(&create_request()).await.unwrap()
    else {
        panic!("expected a submitted operation");
    };
    assert_eq!(operation, "8087e527-71e7-428a-9d5f-6f3eea8487f8");
    match client
        .wait_operation(&operation, Duration::from_secs(5))
        .await
    {
        Err(RuntimeError::OperationFailed { message, .. }) => {
            assert!(message.contains("already exists"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn update_retries_after_a_concurrent_change() {
    let recorded = Arc::new(Recorded::default());
    recorded.route(
        "GET /1.0/instances/web",
        vec![
            (200, vec![("ETag", "\"first\"")], INSTANCE),
            (200, vec![("ETag", "\"second\"")], INSTANCE),
        ],
    );
    recorded.route(
        "PUT /1.0/instances/web",
        vec![status(412, ETAG_MISMATCH), status(202, UPDATE_ASYNC)],
    );
    recorded.route(
        "GET /1.0/operations/11111111-2222-3333-4444-555555555555/wait",
        vec![ok(UPDATE_DONE)],
    );
    let (client, _dir) = stub(Arc::clone(&recorded)).await;
    let edits = std::sync::atomic::AtomicUsize::new(0);
    client
        .update_instance("web", &|edit| {
            edits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            assert!(edit.config.contains_key("volatile.base_image"));
            edit.devices.remove("scratch");
        })
        .await
        .unwrap();
    assert_eq!(edits.load(std::sync::atomic::Ordering::SeqCst), 2);
    let puts: Vec<String> = recorded
        .seen()
        .into_iter()
        .filter(|c| c.starts_with("PUT"))
        .collect();
    assert_eq!(puts.len(), 2);
    assert!(puts[0].ends_with("if-match=\"first\""), "{puts:?}");
    assert!(puts[1].ends_with("if-match=\"second\""), "{puts:?}");
}

#[tokio::test]
async fn exec_on_a_frozen_instance_is_rejected_with_lxd_message() {
    let recorded = Arc::new(Recorded::default());
    recorded.route("POST /1.0/instances/web/exec", vec![status(400, FROZEN)]);
    let (client, _dir) = stub(recorded).await;
    let request = ExecRequest::new(["true"], Duration::from_secs(5));
    match client.exec("web", &request).await {
        Err(RuntimeError::Rejected {
            status: 400,
            message,
            ..
        }) => assert_eq!(message, "Instance is frozen"),
        other => panic!("{other:?}"),
    }
}

/// Routes for one exec that ends at once with exit code 2, its streams answered by `file`.
fn exec_routes(recorded: &Recorded, file: Reply) {
    recorded.route(
        "POST /1.0/instances/web/exec",
        vec![status(202, EXEC_ASYNC)],
    );
    recorded.route(
        "GET /1.0/operations/389e3646-50da-4239-b129-81b978bf2bb2/wait",
        vec![ok(EXEC_DONE)],
    );
    recorded.route("GET /1.0/instances/web/files", vec![file]);
    recorded.route("DELETE /1.0/instances/web/files", vec![ok(EMPTY_SYNC)]);
}

#[tokio::test]
async fn exec_reads_its_streams_from_files_then_deletes_them() {
    let recorded = Arc::new(Recorded::default());
    exec_routes(
        &recorded,
        (206, vec![("Content-Range", "bytes 0-2/3")], "hi\n"),
    );
    let (client, _dir) = stub(Arc::clone(&recorded)).await;
    let out = client
        .exec("web", &ExecRequest::new(["sh"], Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(
        (
            out.exit_code,
            out.stdout_str().as_str(),
            out.stderr_str().as_str()
        ),
        (2, "hi\n", "hi\n")
    );
    let reads: Vec<String> = recorded
        .seen()
        .into_iter()
        .filter(|c| c.starts_with("GET /1.0/instances/web/files?"))
        .collect();
    assert_eq!(reads.len(), 2, "{reads:?}");
    assert!(reads.iter().all(|r| r.contains("berth-exec-")), "{reads:?}");
    assert!(
        !recorded.seen().iter().any(|c| c.contains("/logs/")),
        "no exec log is read: {:?}",
        recorded.seen()
    );
    // Both files go, in the background.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let deletes = recorded
            .seen()
            .into_iter()
            .filter(|c| c.starts_with("DELETE /1.0/instances/web/files?"))
            .count();
        if deletes == 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{deletes} deletes");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn exec_output_past_the_cap_is_cut_and_said_so() {
    let recorded = Arc::new(Recorded::default());
    exec_routes(
        &recorded,
        (206, vec![("Content-Range", "bytes 0-3/4000000000")], "abcd"),
    );
    let (client, _dir) = stub(recorded).await;
    let mut request = ExecRequest::new(["yes"], Duration::from_secs(5));
    request.max_output = 4;
    match client.exec("web", &request).await {
        Err(RuntimeError::TooLarge {
            limit: 4,
            partial: Some(partial),
            ..
        }) => {
            assert_eq!(partial.stdout, b"abcd");
            assert_eq!(partial.exit_code, 2);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn exec_whose_output_file_is_missing_fails_rather_than_answer_empty() {
    let recorded = Arc::new(Recorded::default());
    exec_routes(&recorded, status(404, NOT_FOUND));
    let (client, _dir) = stub(recorded).await;
    let request = ExecRequest::new(["true"], Duration::from_secs(5));
    match client.exec("web", &request).await {
        Err(RuntimeError::Protocol { message, .. }) => {
            assert!(message.contains("/tmp"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_still_running_operation_times_out_and_a_missing_one_vanished() {
    let recorded = Arc::new(Recorded::default());
    recorded.route(
        "GET /1.0/operations/389e3646-50da-4239-b129-81b978bf2bb2/wait",
        vec![ok(EXEC_RUNNING)],
    );
    recorded.route(
        "GET /1.0/operations/00000000-0000-0000-0000-000000000000/wait",
        vec![status(404, OP_NOT_FOUND)],
    );
    let (client, _dir) = stub(recorded).await;
    let started = std::time::Instant::now();
    match client
        .wait_operation(
            "389e3646-50da-4239-b129-81b978bf2bb2",
            Duration::from_millis(300),
        )
        .await
    {
        Err(RuntimeError::Timeout { after, .. }) => assert_eq!(after, Duration::from_millis(300)),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(matches!(
        client
            .wait_operation(
                "00000000-0000-0000-0000-000000000000",
                Duration::from_secs(1)
            )
            .await,
        Err(RuntimeError::OperationVanished { .. })
    ));
}

#[tokio::test]
async fn the_observer_sees_every_request_with_its_status() {
    let recorded = Arc::new(Recorded::default());
    let (client, _dir) = stub(recorded).await;
    let observer = Arc::new(Counting::default());
    let mut config = client.config().clone();
    config.observer = Some(observer.clone());
    let observed = LxdClient::connect(config).await.unwrap();
    assert!(observed.get_instance("web").await.unwrap().is_none());
    let seen = observer.0.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![("GET".to_string(), 200), ("GET".to_string(), 404)]
    );
}

#[test]
fn envelopes_map_to_typed_errors() {
    let cases: Vec<(u16, &str, &str)> = vec![
        (404, NOT_FOUND, "NotFound"),
        (412, ETAG_MISMATCH, "Rejected412"),
        (400, FROZEN, "Rejected400"),
        (
            409,
            r#"{"type":"error","error_code":409,"error":"busy"}"#,
            "Busy",
        ),
        (500, "Internal Server Error", "Rejected500"),
        (200, "not json", "Protocol"),
        (
            202,
            r#"{"type":"async","operation":"/1.0/operations/abc"}"#,
            "Async:abc",
        ),
        (
            202,
            r#"{"type":"async","operation":"/1.0/operations/abc?project=default"}"#,
            "Async:abc",
        ),
        (200, EMPTY_SYNC, "Sync"),
    ];
    for (code, body, want) in cases {
        let raw = RawResponse {
            status: code,
            headers: Default::default(),
            body: Bytes::from_static(body.as_bytes()),
            cut: false,
        };
        let got = match parse_envelope("call", &raw) {
            Ok(super::transport::Reply::Async { operation }) => format!("Async:{operation}"),
            Ok(super::transport::Reply::Sync { .. }) => "Sync".to_string(),
            Err(RuntimeError::NotFound { message, .. }) => {
                assert_eq!(message, "Instance not found");
                "NotFound".to_string()
            }
            Err(RuntimeError::Rejected { status, .. }) => format!("Rejected{status}"),
            Err(RuntimeError::Conflict { .. }) => "Conflict".to_string(),
            Err(RuntimeError::Busy { .. }) => "Busy".to_string(),
            Err(RuntimeError::Protocol { .. }) => "Protocol".to_string(),
            Err(e) => format!("{e:?}"),
        };
        assert_eq!(got, want, "{code} {body}");
    }
}

#[test]
fn busy_is_classified_from_lxd_s_word_not_from_a_name_containing_it() {
    use super::transport::status_error;
    let cases = [
        (400, "Instance is busy running a stop operation", true),
        (409, "busy", true),
        (
            500,
            "Failed creating instance from image berth-tiny (busybox)",
            false,
        ),
        (409, "Instance already exists", false),
    ];
    for (status, message, busy) in cases {
        let error = status_error("start instance p", status, message.to_string());
        assert_eq!(error.is_busy(), busy, "{status} {message}: {error:?}");
        assert_eq!(error.lxd_message(), Some(message));
    }
}

/// Recorded from LXD 5.0.2: the `dir` pool `default`, then a pool that knows no inode total.
const POOL_RESOURCES: &str = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{"space":{"used":72006942720,"total":270553174016},"inodes":{"used":533097,"total":16777216}}}"#;
const POOL_RESOURCES_NO_TOTAL: &str = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{"space":{"used":6094848},"inodes":{"used":0,"total":0}}}"#;
const POOL_MISSING: &str = r#"{"type":"error","status":"","status_code":0,"operation":"","error_code":500,"error":"Storage pool not found","metadata":null}"#;
const IMAGE: &str = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{"auto_update":false,"properties":{"os":"busybox"},"public":false,"aliases":[{"name":"berth-tiny","description":""}],"architecture":"x86_64","cached":false,"filename":"rootfs.tar.gz","fingerprint":"6420ab0d8c2a7f320529eeedf3917b494e27297e9f00e13149069eaff396341c","size":1038509,"type":"container","created_at":"2026-12-05T09:49:57Z"}}"#;

#[tokio::test]
async fn a_storage_pool_s_space_and_an_image_s_size_are_read_as_lxd_gives_them() {
    use crate::runtime::PoolSpace;
    let recorded = Arc::new(Recorded::default());
    recorded.route(
        "GET /1.0/storage-pools/default/resources",
        vec![ok(POOL_RESOURCES), ok(POOL_RESOURCES_NO_TOTAL)],
    );
    recorded.route(
        "GET /1.0/storage-pools/gone/resources",
        vec![status(500, POOL_MISSING)],
    );
    recorded.route("GET /1.0/images/6420ab0d8c2a", vec![ok(IMAGE)]);
    let (client, _dir) = stub(Arc::clone(&recorded)).await;
    let space = client.storage_pool_space("default").await.unwrap();
    assert_eq!(
        space,
        PoolSpace {
            used: 72_006_942_720,
            total: 270_553_174_016
        }
    );
    assert_eq!(space.free(), 270_553_174_016 - 72_006_942_720);
    // A pool that leaves its total out does not know it.
    let space = client.storage_pool_space("default").await.unwrap();
    assert_eq!(space.total, 0);
    assert_eq!(space.free(), 0);
    let missing = client.storage_pool_space("gone").await.unwrap_err();
    assert_eq!(missing.lxd_message(), Some("Storage pool not found"));
    assert_eq!(
        client.image_size("6420ab0d8c2a").await.unwrap(),
        Some(1_038_509)
    );
    assert_eq!(client.image_size("0000").await.unwrap(), None);
}

#[test]
fn a_volume_listing_url_names_its_volume_and_member() {
    use super::client::name_of_url;
    assert_eq!(
        name_of_url("/1.0/storage-pools/default/volumes/custom/berth-u-workspace"),
        Some(("berth-u-workspace".into(), None))
    );
    assert_eq!(
        name_of_url("/1.0/storage-pools/default/volumes/custom/a%20b?project=p&target=m2"),
        Some(("a b".into(), Some("m2".into())))
    );
}

#[tokio::test]
async fn a_read_the_server_dropped_unanswered_is_sent_again_once_and_a_write_is_not() {
    let recorded = Arc::new(Recorded::default());
    recorded.route(
        "GET /1.0/instances/web",
        vec![status(DROP, ""), ok(INSTANCE)],
    );
    recorded.route("PUT /1.0/instances/web/state", vec![status(DROP, "")]);
    let (client, _dir) = stub(recorded.clone()).await;
    let instance = client.get_instance_record("web").await.unwrap();
    assert_eq!(instance.unwrap().name, "web");
    let reads = |seen: &[String]| {
        seen.iter()
            .filter(|s| s.starts_with("GET /1.0/instances/web?"))
            .count()
    };
    assert_eq!(reads(&recorded.seen()), 2);

    let start = client.start_instance("web", Duration::from_secs(5)).await;
    assert!(
        matches!(start, Err(RuntimeError::Transport { .. })),
        "{start:?}"
    );
    let writes = recorded
        .seen()
        .iter()
        .filter(|s| s.starts_with("PUT /1.0/instances/web/state"))
        .count();
    assert_eq!(writes, 1, "a write is never sent twice");
}
