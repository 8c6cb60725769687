"""Calls one tool on a session-scoped MCP endpoint with the official MCP Python SDK.

Usage: mcp_call.py URL TOOL ARGS_JSON

URL is a session's connector URL (`…/mcp/s/{handle}`). Initialises, lists the tools, calls
TOOL with ARGS_JSON and prints one JSON object: {tools, isError, structured, text, content}
(`content`: the result's items as the SDK parsed them, images with their base64 `data`).
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(url: str, tool: str, arguments: dict) -> dict:
    async with streamable_http_client(url) as (read, write, *_):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = [each.name for each in (await session.list_tools()).tools]
            result = await session.call_tool(tool, arguments)
            text = "\n".join(part.text for part in result.content if getattr(part, "text", None))
            return {
                "tools": tools,
                "isError": bool(result.is_error),
                "structured": result.structured_content,
                "text": text,
                "content": [
                    part.model_dump(mode="json", by_alias=True, exclude_none=True)
                    for part in result.content
                ],
            }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))))
