"""Hears a session's tools change with the official Python SDK (`mcp` 2.x) on the sessionless
revision 2026-07-28 (`subscriptions/listen`), for tests/tests/mcp_eras.rs.

Usage: mcp_listen.py URL NAME

URL is a session's `…/mcp/s/{handle}`. Prints `{"acknowledged": honored}` once the listen
stream is acknowledged, then, at each `notifications/tools/list_changed`, lists the tools again
and prints `{"tools": names}`, until NAME is one of them.
"""

import asyncio
import json
import sys

from mcp.client.client import Client


async def main(url: str, name: str) -> None:
    async with Client(url, mode="2026-07-28") as client:
        async with client.listen(tools_list_changed=True) as subscription:
            honored = subscription.honored.model_dump(by_alias=True, exclude_none=True)
            print(json.dumps({"acknowledged": honored}), flush=True)
            async for _event in subscription:
                listed = await client.list_tools(cache_mode="bypass")
                names = [each.name for each in listed.tools]
                print(json.dumps({"tools": names}), flush=True)
                if name in names:
                    return


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
