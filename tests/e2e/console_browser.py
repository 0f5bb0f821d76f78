"""Drives berth's web console in Debian's Chromium through Playwright (tests/console_browser.rs
starts the daemon, the projects and this script). One argument: a JSON object naming the
console's address, the users' tokens, the projects, where screenshots go, Chromium and axe-core.
Prints `step: ...` as it goes and exits non-zero with the reason on the first failure."""

import json
import sys
import urllib.request

from playwright.sync_api import expect, sync_playwright

cfg = json.loads(sys.argv[1])
BASE = cfg["base"]
WAIT = 240_000  # ms: the scheduler and the agent on a busy shared machine


def step(text):
    print(f"step: {text}", flush=True)


def api(method, path, token, body=None, media="application/json"):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(BASE + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", media)
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read() or b"null")


def sign_in(page, token):
    page.goto(BASE + "/ui/")
    page.get_by_label("Your berth token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_text("Signed in as")).to_be_visible()


def no_serious_violations(page, what):
    # axe-core from the npm registry, injected into the page as it is.
    page.add_script_tag(path=cfg["axe"])
    results = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    serious = [v for v in results["violations"] if v.get("impact") in ("serious", "critical")]
    if serious:
        summary = [(v["id"], v["impact"], v["help"], [n["html"] for n in v["nodes"]][:3]) for v in serious]
        raise AssertionError(f"axe-core on {what}: {json.dumps(summary, indent=1)}")
    step(f"axe-core: no serious or critical violations on {what} ({len(results['violations'])} minor)")


def live(page):
    page.wait_for_function("document.body.dataset.live === 'connected'", timeout=WAIT)


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=cfg["chromium"], args=["--no-sandbox"])
    # The console's CSP admits only its own scripts; the test's axe-core is let in.
    alice = browser.new_context(viewport={"width": 1400, "height": 900}, bypass_csp=True)
    # The project page reads the runtime figures and the runner log from LXD before it answers:
    # on a loaded machine that takes longer than Playwright's 30 s default.
    alice.set_default_navigation_timeout(WAIT)
    page = alice.new_page()

    step("alice signs in with her token")
    sign_in(page, cfg["alice"])

    step("the fleet marks the project with an unsaved file and names it")
    dirty = page.locator(f'tr[data-name="{cfg["dirty"]}"]')
    expect(dirty).to_contain_text("UnsavedWork", timeout=WAIT)
    expect(dirty).to_contain_text(cfg["file"])
    expect(page.locator(f'tr[data-name="{cfg["asker"]}"]')).to_contain_text("the agent asks: which colour?")

    step("a change arrives in place, without a reload")
    live(page)
    page.evaluate("window.__sameDocument = 'yes'")
    api("PATCH", f"/apis/berth.dev/v1alpha1/projects/{cfg['dirty']}", cfg["alice"],
        {"metadata": {"labels": {"console-live": "seen"}}}, "application/merge-patch+json")
    expect(dirty).to_contain_text("console-live=seen", timeout=WAIT)
    assert page.evaluate("window.__sameDocument") == "yes", "the page was reloaded"

    no_serious_violations(page, "the fleet page")
    page.screenshot(path=f"{cfg['artifacts']}/console-fleet.png", full_page=True)

    step("a preview button reaches the server in the container")
    button = dirty.locator(f'form[action$="/preview/{cfg["port"]}"] button')
    expect(button).to_be_visible(timeout=WAIT)
    button.click()
    expect(page.locator("body")).to_contain_text("hello from inside the container", timeout=WAIT)
    assert f"{cfg['dirty']}--{cfg['port']}." in page.url, page.url
    assert "berth-ticket" not in page.url, f"the ticket stays out of the address: {page.url}"

    step("the blocked agent's question, answered from its page")
    page.goto(f"{BASE}/ui/projects/{cfg['asker']}")
    expect(page.locator("blockquote.question")).to_contain_text("which colour?")
    no_serious_violations(page, "the project page")
    page.screenshot(path=f"{cfg['artifacts']}/console-project.png", full_page=True)
    page.get_by_label("Your answer").fill("blue")
    page.get_by_role("button", name="Send answer").click()
    expect(page.get_by_role("status")).to_contain_text("Your answer was sent")
    live(page)
    page.evaluate("window.__sameDocument = 'yes'")
    facts = page.locator("#project-live dl.facts")
    expect(facts).to_contain_text("done", timeout=WAIT)
    expect(page.locator("#answer")).to_be_hidden()
    assert page.evaluate("window.__sameDocument") == "yes", "the page was reloaded"
    expect(page.locator("#log")).to_contain_text("answered", timeout=WAIT)

    step("bob, no member, sees nothing of alice's projects")
    bob_context = browser.new_context(bypass_csp=True)
    bob_context.set_default_navigation_timeout(WAIT)
    bob = bob_context.new_page()
    sign_in(bob, cfg["bob"])
    fleet = bob.content()
    for name in (cfg["dirty"], cfg["asker"]):
        assert name not in fleet, f"{name} on bob's fleet page"
        reply = bob.goto(f"{BASE}/ui/projects/{name}")
        assert reply.status == 404, reply.status
        seen = bob.locator("main").inner_text().replace(name, "NAME")
        reply = bob.goto(f"{BASE}/ui/projects/nothing-{name}")
        assert reply.status == 404
        missing = bob.locator("main").inner_text().replace(f"nothing-{name}", "NAME")
        assert seen == missing, (seen, missing)
    browser.close()

print("console_browser: all steps passed", flush=True)
