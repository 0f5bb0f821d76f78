"""A local model fixture: an Anthropic Messages API server on loopback that plays a script.

Real agent CLIs (Claude Code, pointed at it with ANTHROPIC_BASE_URL) run their own agent loop
against it: each request of the loop gets the script's next step, chosen by how many tool calls
the conversation already holds, so the loop advances only as the agent sends back its tool
results. Every answer has its own message id (agents merge turns that share one). Nothing
leaves 127.0.0.1.

Usage: python3 model_fixture.py SCRIPT.json LOG.jsonl

SCRIPT is {"steps": [STEP, ...]} where a STEP is
  {"tool": NAME, "input": {...}}   a tool_use block (the agent runs the tool and answers), or
  {"text": "..."}                  a final text answer (end_turn).
A request that offers no tools (an agent's side query, e.g. a title) gets a short text answer.
Every request is appended to LOG as one JSON line: {"path", "tools": [names], "body"}.
The fixture prints "listening PORT" on stdout once it accepts connections.
"""

import http.server
import itertools
import json
import sys
import threading

SCRIPT = None
LOG = None
LOG_LOCK = threading.Lock()
MESSAGE_IDS = itertools.count(1)


def steps_done(messages):
    """How many steps the conversation has played: its tool calls, one per step."""
    done = 0
    for m in messages:
        if m.get("role") == "assistant" and isinstance(m.get("content"), list):
            done += sum(1 for block in m["content"] if block.get("type") == "tool_use")
    return done


def answer_for(body):
    tools = [t.get("name") for t in body.get("tools") or []]
    steps = SCRIPT["steps"]
    if not tools:
        return [{"type": "text", "text": "berth fixture"}], "end_turn"
    index = steps_done(body.get("messages") or [])
    step = steps[index] if index < len(steps) else {"text": "Nothing left to do."}
    if "tool" in step:
        block = {
            "type": "tool_use",
            "id": f"toolu_fixture_{index:04d}",
            "name": step["tool"],
            "input": step["input"],
        }
        return [block], "tool_use"
    return [{"type": "text", "text": step["text"]}], "end_turn"


def message(body, content, stop_reason):
    return {
        "id": f"msg_fixture_{next(MESSAGE_IDS):06d}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "fixture"),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 10},
    }


def sse(event, data):
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def stream(body, content, stop_reason):
    head = message(body, [], None)
    head["usage"] = {"input_tokens": 10, "output_tokens": 1}
    yield sse("message_start", {"type": "message_start", "message": head})
    for index, block in enumerate(content):
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
        yield sse(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )
        yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
    yield sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 10},
        },
    )
    yield sse("message_stop", {"type": "message_stop"})


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, code, value):
        data = json.dumps(value).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        self.reply(200, {"data": [], "has_more": False})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        path = self.path.split("?")[0]
        with LOG_LOCK:
            with open(LOG, "a") as log:
                names = [t.get("name") for t in body.get("tools") or []]
                log.write(json.dumps({"path": path, "tools": names, "body": body}) + "\n")
        if path.endswith("/count_tokens"):
            self.reply(200, {"input_tokens": 10})
            return
        if not path.endswith("/messages"):
            self.reply(404, {"type": "error", "error": {"type": "not_found_error",
                                                        "message": path}})
            return
        content, stop_reason = answer_for(body)
        if not body.get("stream"):
            self.reply(200, message(body, content, stop_reason))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for chunk in stream(body, content, stop_reason):
            self.wfile.write(chunk)
            self.wfile.flush()
        self.close_connection = True


def main():
    global SCRIPT, LOG
    with open(sys.argv[1]) as script:
        SCRIPT = json.load(script)
    LOG = sys.argv[2]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
