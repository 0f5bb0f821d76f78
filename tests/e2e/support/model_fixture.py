#!/usr/bin/env python3
"""A scripted local model for end-to-end tests of real agent CLIs, on loopback only.

    model_fixture.py --title TITLE --brief-mark MARK --file PATH --file-content TEXT --bash COMMAND
    model_fixture.py --script SCRIPT.json --log LOG.jsonl

Serves, on one port:
- Anthropic Messages (`POST /v1/messages`, streaming SSE when the request asks for it), as
  Claude Code calls it;
- OpenAI Responses (`POST /v1/responses`, streaming SSE, and the same endpoint as a WebSocket,
  which Codex's built-in OpenAI provider opens first: each `response.create` frame is answered
  with the stream's events as text frames), as Codex calls it: the file is written by an
  `exec_command` call, and the command that needs a permission asks for `require_escalated`,
  which Codex's default approval policy (on-request) puts to a person;
- `GET /_fixture/stats`: what was asked, as JSON.
and on a second port an HTTPS_PROXY that refuses and counts every connection.

It prints `model PORT` and `proxy PORT` on stdout, one line each, once both listen.

With --script, Anthropic Messages replies play a script instead, for an agent driving its own
loop through tools the test names: SCRIPT is {"steps": [STEP, ...]} where a STEP is
  {"tool": NAME, "input": {...}}   a tool_use block (the agent runs the tool and answers), or
  {"text": "..."}                  a final text answer (end_turn).
Each request gets the step after the tool calls the conversation already holds, so the loop
advances only as the agent sends back its tool results. A request that offers no tools (an
agent's side query, e.g. a title) gets a short text answer, and a GET of any other path an
empty model list. Every POST is appended to LOG as one JSON line: {"path", "tools": [names],
"body"}.
With --gate FILE as well, a reply to a request offering tools waits until FILE exists (up to
ten minutes), so a test can get the container ready before the agent's first step.

Otherwise the reply is chosen from the request, so the fixture holds no conversation state and any
number of side requests are harmless:
- a request asking for a summary in at most six words gets TITLE;
- the brief (no tool result yet) gets a Write tool call creating PATH with TEXT;
- the Write's result gets a Bash tool call running COMMAND, which needs a permission in the
  CLI's default mode;
- the Bash's result is recorded (`bashResults`) and answered with a final text;
- anything else gets a short text.
"""

import argparse
import base64
import hashlib
import json
import os
import shlex
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATS = {
    "requests": 0,
    "titleRequests": 0,
    "briefRequests": 0,
    "writeResults": 0,
    "bashResults": [],
    "proxyConnections": 0,
    "proxyRequests": [],
    "repeatedCalls": 0,
    "paths": [],
    "websocketConnections": 0,
    "websocketRequests": 0,
}
# Every answered Responses request by its response id: the whole conversation so far (input
# and output items), so that a request continuing one (`previous_response_id`, sending only
# the new items) is read as the whole conversation.
CONVERSATIONS = {}
ARGS = None
SCRIPT = None
TITLE_MARK = "at most six words"


def text_of(content):
    """The text of a message's content (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    out = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            out.append(block.get("text", ""))
        elif block.get("type") == "tool_result":
            out.append(text_of(block.get("content")))
    return "\n".join(out)


def tool_results(messages):
    """(tool name, result text) of every tool result in the conversation, in order."""
    names = {}
    results = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                names[block.get("id")] = block.get("name")
            elif block.get("type") == "tool_result":
                results.append((names.get(block.get("tool_use_id")), text_of(block.get("content")), block.get("is_error", False)))
    return results


def choose(body):
    """The blocks to answer with: a list of ("text", str) or ("tool", name, input)."""
    messages = body.get("messages") or []
    first_user = ""
    for message in messages:
        if message.get("role") == "user":
            first_user = text_of(message.get("content"))
            break
    last_user = text_of(messages[-1].get("content")) if messages else ""
    results = tool_results(messages)
    with LOCK:
        if TITLE_MARK in first_user or TITLE_MARK in last_user:
            STATS["titleRequests"] += 1
            return [("text", ARGS.title)]
        if ARGS.brief_mark not in first_user:
            return [("text", "ok")]
        if not results:
            STATS["briefRequests"] += 1
            return [("text", "I will write the file."), ("tool", "Write", {"file_path": ARGS.file, "content": ARGS.file_content})]
        name, result, is_error = results[-1]
        if name == "Write":
            STATS["writeResults"] += 1
            return [("tool", "Bash", {"command": ARGS.bash, "description": "Run the check"})]
        if name == "Bash":
            STATS["bashResults"].append({"result": result, "isError": bool(is_error)})
            return [("text", "All done.")]
        return [("text", "ok")]


def script_steps_done(messages):
    """How many steps of the script the conversation has played: its tool calls, one a step."""
    done = 0
    for message in messages:
        if message.get("role") == "assistant" and isinstance(message.get("content"), list):
            done += sum(1 for block in message["content"] if isinstance(block, dict) and block.get("type") == "tool_use")
    return done


def choose_scripted(body):
    """choose() for --script: the script's next step."""
    if not body.get("tools"):
        return [("text", "berth fixture")]
    if ARGS.gate:
        deadline = time.monotonic() + 600
        while not os.path.exists(ARGS.gate) and time.monotonic() < deadline:
            time.sleep(0.2)
    steps = SCRIPT["steps"]
    index = script_steps_done(body.get("messages") or [])
    step = steps[index] if index < len(steps) else {"text": "Nothing left to do."}
    if "tool" in step:
        return [("tool", step["tool"], step["input"])]
    return [("text", step["text"])]


def log_request(path, body):
    """Appends one POST to the --log file."""
    names = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
    with LOCK:
        with open(ARGS.log, "a") as log:
            log.write(json.dumps({"path": path, "tools": names, "body": body}) + "\n")


def responses_text(item):
    """The text of a Responses input message."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(c.get("text", "") for c in content or [] if isinstance(c, dict))


def choose_responses(body):
    """The output items answering a Responses request: ("text", str) or ("call", id, args)."""
    items = [i for i in body.get("input") or [] if isinstance(i, dict)]
    users = [responses_text(i) for i in items if i.get("type", "message") == "message" and i.get("role") == "user"]
    outputs = {i.get("call_id"): i.get("output") for i in items if i.get("type") == "function_call_output"}
    calls = [i.get("call_id") for i in items if i.get("type") == "function_call"]
    with LOCK:
        if any(TITLE_MARK in u for u in users):
            STATS["titleRequests"] += 1
            return [("text", ARGS.title)]
        if not any(ARGS.brief_mark in u for u in users):
            return [("text", "ok")]
        answered = [c for c in calls if c in outputs]
        if not answered:
            if calls:
                # A call whose result the CLI lost (it was interrupted): asked again.
                STATS["repeatedCalls"] += 1
                return [("call", calls[-1], CALL_ARGS[calls[-1].split("-")[1]]())]
            STATS["briefRequests"] += 1
            return [("text", "I will write the file."), ("call", f"call-write-{STATS['requests']}", CALL_ARGS["write"]())]
        last = answered[-1]
        output = outputs[last]
        if isinstance(output, dict):
            output = output.get("content") or json.dumps(output)
        if last.startswith("call-write-"):
            STATS["writeResults"] += 1
            return [("call", f"call-bash-{STATS['requests']}", CALL_ARGS["bash"]())]
        if last.startswith("call-bash-"):
            STATS["bashResults"].append({"result": str(output), "isError": "exited with code 0" not in str(output)})
            return [("text", "All done.")]
        return [("text", "ok")]


CALL_ARGS = {
    "write": lambda: {"cmd": f"printf '%s\\n' {shlex.quote(ARGS.file_content)} > {shlex.quote(ARGS.file)}"},
    "bash": lambda: {
        "cmd": ARGS.bash,
        "sandbox_permissions": "require_escalated",
        "justification": "Run the check",
    },
}


def responses_events(body):
    """The events answering a Responses request, as SSE data or WebSocket frames carry them."""
    with LOCK:
        rid = f"resp_fx{STATS['requests']}"
        earlier = CONVERSATIONS.get(body.get("previous_response_id"), [])
    whole = dict(body, input=earlier + list(body.get("input") or []))
    model = body.get("model", "gpt-fixture")
    items = []
    for i, block in enumerate(choose_responses(whole)):
        if block[0] == "text":
            items.append({"type": "message", "role": "assistant", "id": f"msg_{rid}_{i}", "status": "completed",
                          "content": [{"type": "output_text", "text": block[1], "annotations": []}]})
        else:
            items.append({"type": "function_call", "id": f"fc_{rid}_{i}", "status": "completed",
                          "call_id": block[1], "name": "exec_command", "arguments": json.dumps(block[2])})
    with LOCK:
        CONVERSATIONS[rid] = whole["input"] + items
    events = [{"type": "response.created", "response": {"id": rid, "model": model, "status": "in_progress"}}]
    for i, item in enumerate(items):
        events.append({"type": "response.output_item.added", "output_index": i, "item": dict(item, status="in_progress")})
        events.append({"type": "response.output_item.done", "output_index": i, "item": item})
    events.append({"type": "response.completed", "response": {"id": rid, "model": model, "status": "completed", "output": items,
                   "usage": {"input_tokens": 10, "output_tokens": 10, "total_tokens": 20}}})
    return events


WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def ws_read(stream):
    """One WebSocket frame from a client (masked, as RFC 6455 requires): (opcode, payload), or
    None when the connection ended. Fragmented messages are joined."""
    payload = b""
    while True:
        head = stream.read(2)
        if len(head) < 2:
            return None
        fin, opcode = head[0] & 0x80, head[0] & 0x0F
        length = head[1] & 0x7F
        if length == 126:
            length = int.from_bytes(stream.read(2), "big")
        elif length == 127:
            length = int.from_bytes(stream.read(8), "big")
        mask = stream.read(4) if head[1] & 0x80 else b"\0\0\0\0"
        data = stream.read(length)
        if len(data) < length:
            return None
        payload += bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        if opcode:
            first = opcode
        if fin:
            return first, payload


def ws_write(stream, opcode, payload):
    """One unmasked frame to the client."""
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, n])
    elif n < 1 << 16:
        head = bytes([0x80 | opcode, 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 127]) + n.to_bytes(8, "big")
    stream.write(head + payload)
    stream.flush()


def sse(event, data):
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class Model(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("fixture: " + (fmt % args) + "\n")

    def do_GET(self):
        if self.headers.get("upgrade", "").lower() == "websocket" and self.path.split("?")[0].endswith("/v1/responses"):
            self.websocket()
        elif self.path.startswith("/_fixture/stats"):
            with LOCK:
                body = json.dumps(STATS).encode()
            self.reply(200, body, "application/json")
        elif SCRIPT is not None:
            self.reply(200, json.dumps({"data": [], "has_more": False}).encode(), "application/json")
        else:
            self.reply(404, b'{"error":"not found"}', "application/json")

    def do_HEAD(self):
        self.reply(200, b"", "text/plain")

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        with LOCK:
            STATS["requests"] += 1
            STATS["paths"].append(self.path)
        path = self.path.split("?")[0]
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        if SCRIPT is not None:
            log_request(path, body)
        if path.endswith("/count_tokens"):
            self.reply(200, json.dumps({"input_tokens": 10}).encode(), "application/json")
            return
        if path.endswith("/v1/responses"):
            self.stream_responses(body)
            return
        if not path.endswith("/v1/messages"):
            self.reply(404, b'{"type":"error","error":{"type":"not_found_error","message":"no such route"}}', "application/json")
            return
        blocks = choose_scripted(body) if SCRIPT is not None else choose(body)
        model = body.get("model", "claude-fixture")
        if body.get("stream"):
            self.stream(blocks, model)
        else:
            self.reply(200, json.dumps(self.message(blocks, model)).encode(), "application/json")

    def message(self, blocks, model):
        content = []
        for i, block in enumerate(blocks):
            if block[0] == "text":
                content.append({"type": "text", "text": block[1]})
            else:
                content.append({"type": "tool_use", "id": f"toolu_fx{STATS['requests']}_{i}", "name": block[1], "input": block[2]})
        stop = "tool_use" if any(b[0] == "tool" for b in blocks) else "end_turn"
        return {
            "id": f"msg_fx{STATS['requests']}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 10},
        }

    def stream(self, blocks, model):
        msg = self.message(blocks, model)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        start = dict(msg, content=[], stop_reason=None)
        out = [sse("message_start", {"type": "message_start", "message": start})]
        for i, block in enumerate(msg["content"]):
            if block["type"] == "text":
                out.append(sse("content_block_start", {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}))
                out.append(sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": block["text"]}}))
            else:
                out.append(sse("content_block_start", {"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
                out.append(sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}}))
            out.append(sse("content_block_stop", {"type": "content_block_stop", "index": i}))
        out.append(sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None}, "usage": {"output_tokens": 10}}))
        out.append(sse("message_stop", {"type": "message_stop"}))
        self.wfile.write(b"".join(out))
        self.wfile.flush()
        self.close_connection = True

    def stream_responses(self, body):
        events = responses_events(body)
        self.reply(200, b"".join(sse(e["type"], e) for e in events), "text/event-stream")

    def websocket(self):
        """Serves the Responses WebSocket: a `response.create` text frame per request."""
        key = self.headers.get("sec-websocket-key", "")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("upgrade", "websocket")
        self.send_header("connection", "Upgrade")
        self.send_header("sec-websocket-accept", accept)
        self.end_headers()
        self.wfile.flush()
        with LOCK:
            STATS["websocketConnections"] += 1
        self.close_connection = True
        while True:
            frame = ws_read(self.rfile)
            if frame is None:
                return
            opcode, payload = frame
            if opcode == 0x8:
                ws_write(self.wfile, 0x8, payload[:2])
                return
            if opcode == 0x9:
                ws_write(self.wfile, 0xA, payload)
                continue
            if opcode != 0x1:
                continue
            try:
                request = json.loads(payload)
            except ValueError:
                continue
            if request.get("type") != "response.create":
                continue
            with LOCK:
                STATS["requests"] += 1
                STATS["websocketRequests"] += 1
            for event in responses_events(request):
                ws_write(self.wfile, 0x1, json.dumps(event).encode())

    def reply(self, code, body, ctype):
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def refuse_proxy(listener):
    """Counts every connection, notes its request line, and closes it: nothing passes."""
    while True:
        conn, _ = listener.accept()
        conn.settimeout(2)
        try:
            first = conn.recv(1024).split(b"\r\n", 1)[0].decode("latin-1")
        except OSError:
            first = ""
        with LOCK:
            STATS["proxyConnections"] += 1
            STATS["proxyRequests"].append(first)
        conn.close()


def main():
    global ARGS, SCRIPT
    p = argparse.ArgumentParser()
    p.add_argument("--script", help="a step script to play instead of the brief's replies")
    p.add_argument("--log", help="with --script: where every request is appended")
    p.add_argument("--gate", help="with --script: replies offering tools wait for this file")
    p.add_argument("--title")
    p.add_argument("--brief-mark", help="a string only the brief contains")
    p.add_argument("--file")
    p.add_argument("--file-content")
    p.add_argument("--bash")
    ARGS = p.parse_args()
    if ARGS.script:
        if not ARGS.log:
            p.error("--script needs --log")
        with open(ARGS.script) as script:
            SCRIPT = json.load(script)
    else:
        missing = [f"--{n.replace('_', '-')}" for n in ("title", "brief_mark", "file", "file_content", "bash") if getattr(ARGS, n) is None]
        if missing:
            p.error(f"without --script, {', '.join(missing)} are required")
    model = ThreadingHTTPServer(("127.0.0.1", 0), Model)
    model.daemon_threads = True
    proxy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    proxy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    proxy.bind(("127.0.0.1", 0))
    proxy.listen(64)
    threading.Thread(target=refuse_proxy, args=(proxy,), daemon=True).start()
    print(f"model {model.server_address[1]}", flush=True)
    print(f"proxy {proxy.getsockname()[1]}", flush=True)
    model.serve_forever()


if __name__ == "__main__":
    main()
