// An MCP client written with the official TypeScript SDK, driving `bashfleet mcp` over
// stdio as an agent harness built on that SDK does. Run by tests/e2e/test_mcp_typescript.py:
//
//   node progress_client.mjs long   TOOL ARGS_JSON        -> {"result", "progress"} on stdout
//   node progress_client.mjs cancel TOOL ARGS_JSON MARKER -> aborts the call once MARKER exists
//
// The server's command line is the JSON array in BASHFLEET_SERVER_COMMAND.
import { existsSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [mode, tool, rawArgs, marker] = process.argv.slice(2);
const [command, ...args] = JSON.parse(process.env.BASHFLEET_SERVER_COMMAND);
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" });
const client = new Client({ name: "bashfleet-ts-e2e", version: "1.0.0" });
await client.connect(transport);

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

if (mode === "long") {
  // The SDK's default request timeout (60 s) stays: each progress notification resets it.
  const progress = [];
  const started = Date.now();
  const result = await client.callTool({ name: tool, arguments: JSON.parse(rawArgs) }, undefined, {
    onprogress: (note) => progress.push({ ...note, at: (Date.now() - started) / 1000 }),
    resetTimeoutOnProgress: true,
  });
  console.log(JSON.stringify({ result, progress, seconds: (Date.now() - started) / 1000 }));
} else if (mode === "cancel") {
  const controller = new AbortController();
  const call = client.callTool({ name: tool, arguments: JSON.parse(rawArgs) }, undefined, {
    signal: controller.signal,
  });
  const outcome = call.then(
    (result) => ({ result }),
    (error) => ({ error: String(error) }),
  );
  const deadline = Date.now() + 30000;
  while (!existsSync(marker) && Date.now() < deadline) {
    await sleep(50);
  }
  controller.abort("the user pressed stop");
  console.log(JSON.stringify({ markerSeen: existsSync(marker), ...(await outcome) }));
} else {
  throw new Error(`unknown mode ${mode}`);
}
await client.close();
