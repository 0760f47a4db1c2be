// An MCP server over stdio built with the official TypeScript SDK (1.x, revisions up to
// 2025-11-25): a server nobody at relayq wrote, whose tool list changes while it runs.
// Its tool `grow` adds the tool `grown`; the SDK tells the client its tools changed
// (notifications/tools/list_changed).
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";

const server = new McpServer({ name: "relayq-ts-test-server", version: "1.0.0" });
let grown = null;

server.registerTool("grow", { description: "Add the tool grown" }, async () => {
  if (grown === null) {
    grown = server.registerTool("grown", { description: "A tool grow added" }, async () => ({
      content: [{ type: "text", text: `grown (pid ${process.pid})` }],
    }));
  }
  return { content: [{ type: "text", text: "grew" }] };
});

await server.connect(new StdioServerTransport());
