"""An MCP client made of the official Python SDK (`mcp` 2.x) in one of its modes, for the
end-to-end tests (tests/tests/mcp_eras.rs).

Usage: mcp_revision.py URL MODE [TOOL ARGS_JSON]

MODE is the SDK's own: `legacy` (the `initialize` handshake, offering 2025-11-25), `2026-07-28`
(sessionless: every request carries its revision and client in `_meta`) or `auto` (tries
`server/discover`, falls back to `initialize`). Connects to URL, lists the tools, calls TOOL
(encodePlantUML by default) and prints one JSON object:
{protocolVersion, tools, ttlMs, cacheScope, isError, structured, text}.
"""

import asyncio
import json
import sys

from mcp.client.client import Client

PLANTUML = {"plantumlCode": "@startuml\nA -> B\n@enduml"}


async def main(url: str, mode: str, tool: str, arguments: dict) -> dict:
    async with Client(url, mode=mode) as client:
        listed = await client.list_tools()
        result = await client.call_tool(tool, arguments)
        text = "\n".join(part.text for part in result.content if getattr(part, "text", None))
        return {
            "protocolVersion": client.protocol_version,
            "tools": [each.name for each in listed.tools],
            "ttlMs": listed.ttl_ms,
            "cacheScope": listed.cache_scope,
            "isError": bool(result.is_error),
            "structured": result.structured_content,
            "text": text,
        }


if __name__ == "__main__":
    tool = sys.argv[3] if len(sys.argv) > 3 else "encodePlantUML"
    arguments = json.loads(sys.argv[4]) if len(sys.argv) > 4 else PLANTUML
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], tool, arguments))))
