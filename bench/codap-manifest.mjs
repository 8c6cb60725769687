// Prints the CODAP plugin's manifest as the plugin registers it — `{"tools": [...]}`, built by
// the plugin's own modules (services/gateway/plugin/main.js does the same: `codapTools` into a
// `Dispatcher`, whose `manifest()` the SDK's transport sends). The bench's idle tabs register
// it. Usage: node bench/codap-manifest.mjs [REPOSITORY_ROOT]
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';

const root = resolve(process.argv[2] ?? new URL('..', import.meta.url).pathname);
const load = (path) => import(pathToFileURL(resolve(root, path)).href);
const { Dispatcher } = await load('services/gateway/sdk/dispatcher.js');
const { codapTools } = await load('services/gateway/plugin/tools.js');

const dispatcher = new Dispatcher();
// The handlers are never run here: no CODAP link is needed.
for (const tool of codapTools(null)) dispatcher.register(tool.id, tool.description, tool.functions);
process.stdout.write(JSON.stringify({ tools: dispatcher.manifest() }));
