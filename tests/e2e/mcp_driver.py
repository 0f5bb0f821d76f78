"""An MCP client (the official Python SDK) driving `berth mcp` over stdio, steered line by line.

Run by tests/mcp_bridge.rs: `python mcp_driver.py BERTH_BINARY ARG...` spawns
`BERTH_BINARY ARG...` (e.g. `--server SOCKET mcp NAME`) as the MCP server, then reads one JSON
request per line on stdin and answers each with one JSON line on stdout:

  {"op": "tools"}                                  -> {"tools": [{name, inputSchema, ...}]}
  {"op": "call", "tag": T, "name": N, "arguments": A, "progress": bool}
                                                   -> starts the call in the background: {"started": T}
  {"op": "wait", "tag": T}                         -> {"isError", "text", "progress": [messages]}
  {"op": "cancel", "tag": T}                       -> cancels the call (the SDK sends
                                                      notifications/cancelled): {"cancelled": T}
  {"op": "resources"}                              -> {"resources": [...], "contents": {uri: [...]}}
  {"op": "quit"}                                   -> {"quit": true}

Errors of the driver itself are answered as {"driverError": "..."}.
"""

import json
import sys

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


def wire(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class Call:
    def __init__(self):
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.progress = []
        self.result = None


async def answer(value):
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


async def run_call(session, call, name, arguments, progress):
    async def on_progress(value, total, message):
        call.progress.append(message or "")

    with call.scope:
        try:
            result = await session.call_tool(
                name,
                arguments,
                progress_callback=on_progress if progress else None,
            )
            body = wire(result)
            text = "\n".join(
                c.get("text", "") for c in body.get("content", []) if c.get("type") == "text"
            )
            call.result = {
                "isError": bool(body.get("isError", False)),
                "text": text,
                "progress": call.progress,
            }
        except Exception as err:  # noqa: BLE001 - reported to the test, which fails on it
            call.result = {"driverError": f"{type(err).__name__}: {err}"}
    if call.result is None:
        call.result = {"cancelledLocally": True, "progress": call.progress}
    call.done.set()


async def main():
    binary, args = sys.argv[1], sys.argv[2:]
    params = StdioServerParameters(command=binary, args=args)
    calls = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            async with anyio.create_task_group() as group:
                while True:
                    line = await anyio.to_thread.run_sync(sys.stdin.readline)
                    if not line:
                        break
                    request = json.loads(line)
                    op = request["op"]
                    try:
                        if op == "tools":
                            listed = await session.list_tools()
                            await answer({"tools": [wire(t) for t in listed.tools]})
                        elif op == "call":
                            call = Call()
                            calls[request["tag"]] = call
                            group.start_soon(
                                run_call,
                                session,
                                call,
                                request["name"],
                                request.get("arguments", {}),
                                request.get("progress", False),
                            )
                            await answer({"started": request["tag"]})
                        elif op == "wait":
                            call = calls[request["tag"]]
                            await call.done.wait()
                            await answer(call.result)
                        elif op == "cancel":
                            calls[request["tag"]].scope.cancel()
                            await answer({"cancelled": request["tag"]})
                        elif op == "resources":
                            listed = await session.list_resources()
                            resources = [wire(r) for r in listed.resources]
                            contents = {}
                            for resource in resources:
                                read_back = await session.read_resource(resource["uri"])
                                contents[resource["uri"]] = wire(read_back).get("contents", [])
                            await answer({"resources": resources, "contents": contents})
                        elif op == "quit":
                            await answer({"quit": True})
                            break
                        else:
                            await answer({"driverError": f"unknown op {op!r}"})
                    except Exception as err:  # noqa: BLE001 - reported to the test
                        await answer({"driverError": f"{type(err).__name__}: {err}"})
                group.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main)
