"""The official MCP Python SDK against toolrelay behind a round-robin balancer.

Usage: mcp_round_robin.py BASE_URL CODE

Opens a new HTTP connection for every request (no keep-alive), so a balancer that alternates
per connection sends each request to the next gateway. On /mcp it initialises, lists and calls
a built-in tool, pairs with CODE, calls the tab's echo tool, and generates then solves a MIP
problem (the id must be found by whichever gateway serves the next request); on the session's
/mcp/s/{handle} it lists the tab's tools and calls echo. Prints one JSON object of what it saw;
exits non-zero (with the error) if anything fails.
"""

import asyncio
import json
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

MODEL = (
    "import pulp\n"
    "prob = pulp.LpProblem('p', pulp.LpMaximize)\n"
    "x = pulp.LpVariable('x', 0, 7, cat='Integer')\n"
    "prob += 2 * x + 1"
)


def fresh_connections() -> httpx2.AsyncClient:
    limits = httpx2.Limits(max_keepalive_connections=0)
    return httpx2.AsyncClient(limits=limits, timeout=httpx2.Timeout(30.0, read=60.0))


async def call(session: ClientSession, name: str, arguments: dict) -> dict:
    result = await session.call_tool(name, arguments)
    if result.is_error:
        raise RuntimeError(f"{name} failed: {result}")
    return result.structured_content or {}


async def main(base: str, code: str) -> dict:
    seen = {}
    async with fresh_connections() as http, streamable_http_client(
        f"{base}/mcp", http_client=http
    ) as (read, write, *_):
        async with ClientSession(read, write) as session:
            await session.initialize()
            names = [tool.name for tool in (await session.list_tools()).tools]
            names_again = [tool.name for tool in (await session.list_tools()).tools]
            seen["tools"] = names
            seen["tools_stable"] = names == names_again
            encoded = await call(session, "encodePlantUML", {"plantumlCode": "A -> B"})
            seen["plantuml_url"] = encoded.get("url")
            paired = await call(session, "connect_session", {"code": code})
            handle = paired["handle"]
            seen["echo"] = [
                await call(
                    session,
                    "call_session_tool",
                    {"session": code, "name": "echo", "arguments": {"text": f"python {n}"}},
                )
                for n in range(2)
            ]
            generated = await call(
                session, "generate_mip_problem", {"problemDefinitionCode": MODEL}
            )
            solved = await call(
                session, "solve_mip_problem", {"problemId": generated["problemId"]}
            )
            seen["mip_status"] = solved.get("status")
    async with fresh_connections() as http, streamable_http_client(
        f"{base}/mcp/s/{handle}", http_client=http
    ) as (read, write, *_):
        async with ClientSession(read, write) as session:
            await session.initialize()
            seen["scoped_tools"] = [tool.name for tool in (await session.list_tools()).tools]
            seen["scoped_echo"] = await call(session, "echo", {"text": "scoped python"})
    return seen


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
