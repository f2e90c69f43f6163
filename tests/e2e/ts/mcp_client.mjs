// The TypeScript MCP SDK's stdio client driving `bashfleet mcp`, for the end-to-end tests.
//
//   node mcp_client.mjs '<server argv as JSON>' '<steps as JSON>'
//
// Each step is {"tool": NAME, "arguments": {...}}; a string argument "$SESSION" is
// replaced by the last `session ID N` a result named (codex), "$JOB" by the last job id
// (native). Prints one JSON line: the tools listed and every result's text and isError.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, ...args] = JSON.parse(process.argv[2]);
const steps = JSON.parse(process.argv[3]);
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" });
const client = new Client({ name: "bashfleet-e2e-ts", version: "1.0.0" });
await client.connect(transport);
const tools = (await client.listTools()).tools.map((tool) => tool.name);
const results = [];
let session = null;
let job = null;
for (const step of steps) {
  const fill = (value) => {
    if (value === "$SESSION") return session;
    if (value === "$JOB") return job;
    return value;
  };
  const argumentsFilled = Object.fromEntries(
    Object.entries(step.arguments).map(([key, value]) => [key, fill(value)]),
  );
  const result = await client.callTool(
    { name: step.tool, arguments: argumentsFilled }, undefined, { timeout: 120000 },
  );
  const text = result.content.map((block) => block.text).join("");
  const sessionMatch = text.match(/session ID (\d+)/);
  if (sessionMatch) session = Number(sessionMatch[1]);
  const jobMatch = text.match(/job (j[0-9a-f]{15})/);
  if (jobMatch) job = jobMatch[1];
  results.push({ text, isError: Boolean(result.isError) });
}
await client.close();
console.log(JSON.stringify({ tools, results }));
