"""Drives berth's IDE (code-server behind the preview listener) in Debian's Chromium through
Playwright (tests/e2e/ide.rs starts the daemon, the project and this script). One argument: a
JSON object naming the IDE URL with its one-time ticket, the file to create and its text, where
screenshots go, Chromium, a file whose appearance lets the browser close (the test looks at
the project's activity while the IDE is open), and the console's address, the member's token
and the project, for the console's Open IDE. Prints `step: ...` as it goes and exits non-zero
with the reason on the first failure."""

import json
import os
import re
import sys
import time

from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect, sync_playwright

cfg = json.loads(sys.argv[1])
WAIT = cfg.get("waitMs", 240_000)  # ms: the workbench's first load on a busy shared machine


def step(text):
    print(f"step: {text}", flush=True)


def command(page, title):
    """Runs a command by its title through the command palette. On its first start the
    workbench opens a welcome page, which may take the focus and close the palette: then the
    palette is opened again."""
    palette = page.locator(".quick-input-widget input")
    # The row whose label begins with the title (others may merely contain its words).
    row = page.get_by_role("option", name=re.compile("^" + re.escape(title)))
    for _ in range(5):
        page.keyboard.press("F1")
        try:
            palette.fill(f">{title}", timeout=10_000)
            row.first.click(timeout=10_000)
            return
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
    raise AssertionError(f"the command palette never ran {title!r}")


def drive(page):
    step("the ticket URL signs the browser in and the workbench loads")
    page.goto(cfg["url"])
    expect(page.locator(".monaco-workbench")).to_be_visible(timeout=WAIT)
    if "berth-ticket" in page.url:
        raise AssertionError(f"the ticket stayed in the address: {page.url}")
    # The explorer shows /workspace, the folder berth opens.
    expect(page.locator(".explorer-folders-view, .explorer-viewlet").first).to_be_visible(timeout=WAIT)
    page.screenshot(path=f"{cfg['artifacts']}/ide-workbench.png")

    step("a new file is typed in the editor and saved into /workspace")
    command(page, "File: New Untitled Text File")
    # The new editor takes the focus as it opens.
    expect(page.locator(".editor-instance .monaco-editor.focused").first).to_be_visible(timeout=WAIT)
    page.keyboard.type(cfg["text"])
    page.keyboard.press("Control+s")
    # code-server's save dialog is a quick input holding a path: once it shows its own
    # suggestion, ours replaces it.
    path_input = page.locator(".quick-input-widget input")
    expect(path_input).to_have_value(re.compile("^/workspace/"), timeout=WAIT)
    path_input.fill(cfg["path"])
    expect(path_input).to_have_value(cfg["path"], timeout=WAIT)
    path_input.press("Enter")
    expect(page.locator(".tab.active")).to_contain_text(os.path.basename(cfg["path"]), timeout=WAIT)
    expect(page.locator(".tab.active.dirty")).to_have_count(0, timeout=WAIT)
    step("saved")

    page.screenshot(path=f"{cfg['artifacts']}/ide-saved.png")

    # The IDE stays open (its websocket counts as activity) until the test has looked.
    deadline = time.monotonic() + WAIT / 1000
    while not os.path.exists(cfg["release"]):
        if time.monotonic() > deadline:
            raise AssertionError("the test never let the browser close")
        time.sleep(0.2)


def console(page):
    step("the console's Open IDE button opens the same IDE")
    page.goto(cfg["console"] + "/ui/")
    page.get_by_label("Your berth token").fill(cfg["token"])
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_text("Signed in as")).to_be_visible(timeout=WAIT)
    page.goto(f"{cfg['console']}/ui/projects/{cfg['project']}")
    page.get_by_role("button", name="Open IDE").click()
    expect(page.locator(".monaco-workbench")).to_be_visible(timeout=WAIT)
    host = page.url.split("/")[2]
    if not host.startswith(f"{cfg['project']}--ide."):
        raise AssertionError(f"Open IDE led to {page.url}")
    expect(page.get_by_text("failed to connect to the server")).to_have_count(0)
    page.screenshot(path=f"{cfg['artifacts']}/ide-from-console.png")


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=cfg["chromium"], args=["--no-sandbox"])
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(WAIT)
    page = context.new_page()
    try:
        drive(page)
        context.close()
        # A new browser profile: no cookie for the IDE host, only the console's sign-in.
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.set_default_timeout(WAIT)
        page = context.new_page()
        console(page)
    except Exception:
        page.screenshot(path=f"{cfg['artifacts']}/ide-failure.png")
        raise
    browser.close()
    print("all steps passed", flush=True)
