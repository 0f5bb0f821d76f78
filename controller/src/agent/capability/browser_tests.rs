use super::*;

#[test]
fn the_look_names_what_the_image_lacks_in_one_line() {
    assert_eq!(
        read_look("chromium /usr/bin/chromium\n"),
        Ok("/usr/bin/chromium".to_string())
    );
    let lacking = read_look("missing playwright-mcp chromium\n").unwrap_err();
    assert!(
        lacking.starts_with("browser: the image has no playwright-mcp, chromium"),
        "{lacking}"
    );
    assert!(!lacking.contains('\n'));
    for odd in [
        "",
        "chromium relative/path",
        "chromium /usr/bin/chro\"mium",
        "what",
    ] {
        let failure = read_look(odd).unwrap_err();
        assert!(failure.starts_with("browser: "), "{odd}: {failure}");
    }
}

#[test]
fn the_files_point_the_mcp_server_at_the_image_chromium() {
    let files = files("/usr/bin/chromium");
    let by_path = |path: &str| {
        files
            .iter()
            .find(|(p, _, _)| *p == path)
            .unwrap_or_else(|| panic!("{path} is written"))
    };
    let config: serde_json::Value = serde_json::from_str(&by_path(BROWSER_CONFIG).1).unwrap();
    let launch = &config["browser"]["launchOptions"];
    assert_eq!(launch["executablePath"], "/usr/bin/chromium");
    assert_eq!(launch["headless"], true);
    assert_eq!(config["browser"]["isolated"], true);
    assert!(
        launch["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--no-sandbox"))
    );
    assert_eq!(config["outputDir"], BROWSER_OUTPUT);

    let servers: serde_json::Value = serde_json::from_str(&by_path(MCP_SERVERS).1).unwrap();
    let server = &servers["mcpServers"][SERVER_NAME];
    assert_eq!(server["command"], SERVER_COMMAND);
    assert_eq!(server["args"], json!(["--config", BROWSER_CONFIG]));

    let (_, script, mode) = by_path(BROWSER_SCREENSHOT);
    assert_eq!(*mode, 0o755);
    assert!(script.contains("\"/usr/bin/chromium\" --no-sandbox "));
    assert!(!script.contains('@'), "{script}");
    assert!(by_path(BROWSER_SKILL).1.contains("name: browser"));
}
