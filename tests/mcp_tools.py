"""A small MCP server for the MCP host tests (``python -m tests.mcp_tools`` serves it over stdio): a read-only
tool, a destructive one and one without hints, each noting its runs in ``RAN`` (in-process only)."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

RAN: list[str] = []
shop = MCPServer("shop")


@shop.tool(annotations=ToolAnnotations(read_only_hint=True))
def get_weather(city: str) -> str:
    """Today's weather in a city."""
    RAN.append("get_weather")
    return f"Sunny in {city}"


@shop.tool(annotations=ToolAnnotations(destructive_hint=True))
def cancel_booking(booking: str) -> str:
    """Cancel a restaurant booking."""
    RAN.append("cancel_booking")
    return f"Cancelled {booking}"


@shop.tool()
def book_table(city: str, people: int) -> str:
    """Book a restaurant table."""
    RAN.append("book_table")
    return f"Booked for {people} in {city}"


if __name__ == "__main__":
    shop.run("stdio")
