// One MCP tool call through the official TypeScript SDK's Client, as an MCP client of
// today (protocol 2025-11-25) makes it: the tests' client that nobody at relayq wrote.
//
// node drive.mjs '<plan as JSON>'
//   plan.url: streamable HTTP at this URL, with plan.token as its bearer token; or
//   plan.stdio: {command, args, env}: a server the client starts, over stdin and stdout.
//   plan.tool, plan.prompt: the call. plan.elicit: declare form elicitation.
//   plan.decline: the tool whose relay calls are declined (the others are run here).
// Prints one JSON line per elicitation ({elicited}), then {result} or {error}, and the
// protocol revision the session negotiated.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const plan = JSON.parse(process.argv[2]);
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");

const capabilities = plan.elicit ? { elicitation: { form: {} } } : {};
const client = new Client({ name: "relayq-ts-test", version: "1.0.0" }, { capabilities });

if (plan.elicit) {
  client.setRequestHandler(ElicitRequestSchema, async (request) => {
    const params = request.params;
    say({ elicited: params });
    const [about] = Object.values(params._meta?.["relayq/calls"] ?? {});
    if (about && about.name === plan.decline) {
      return { action: "decline" };
    }
    return { action: "accept", content: { output: `${about?.name} ran here` } };
  });
}

const transport = plan.stdio
  ? new StdioClientTransport({ ...plan.stdio, stderr: "inherit" })
  : new StreamableHTTPClientTransport(new URL(plan.url), {
      requestInit: { headers: { Authorization: `Bearer ${plan.token}` } },
    });

try {
  await client.connect(transport);
  const tools = await client.listTools();
  const result = await client.callTool(
    { name: plan.tool, arguments: { prompt: plan.prompt } },
    undefined,
    { timeout: 120000 },
  );
  say({
    protocolVersion: transport.protocolVersion ?? null,
    tools: tools.tools.map((t) => t.name),
    result,
  });
} catch (error) {
  say({ error: { code: error.code ?? null, message: String(error.message ?? error) } });
} finally {
  await client.close();
}
