#!/usr/bin/env node
// berth's agent adapter: runs an agent CLI that does not write berth's status file itself, reads
// the CLI's machine-readable output, and keeps the agent status contract (/run/berth/agent.json):
// the brief acknowledged once the CLI has really started, then working / blocked (with the
// question) / done / failed (with the exit code), the CLI's session id, and a title the agent
// gives when asked for a summary of its brief in at most six words.
//
//   adapter run PROTOCOL -- COMMAND [ARGS...]   run the profile's runner under PROTOCOL
//   adapter mcp-permission                      the MCP server of Claude Code's permission
//                                               prompts (started by Claude Code itself)
//
// PROTOCOL is claude-stream-json (Claude Code's `-p --output-format stream-json`, permission
// requests through the `permission` tool served here) or codex-app-server (Codex's app server,
// JSON-RPC over stdio, approvals arriving as requests).
//
// The MCP servers a project's capabilities publish (/workspace/.berth/mcp.json, e.g. the
// browser) are handed to the CLI with its tools allowed (Claude Code) or as configuration
// overrides (Codex).
//
// A person answers through berth (`berth answer NAME allow|deny|TEXT`), which writes
// /run/berth/answer. The adapter is one file with no dependencies, so any image with Node runs
// it (berth-agents); berth pushes it at Bootstrapped.
//
// Environment (set by berth's runner start): BERTH_BRIEF_ID, BERTH_BRIEF_FILE,
// BERTH_STATUS_FILE, BERTH_ANSWER_FILE, BERTH_RUN_DIR; BERTH_RESUME_SESSION (the session of an
// interrupted brief, to resume rather than start over); BERTH_TITLE_KNOWN (set when berth has
// recorded a title: it is not asked again).

'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');
const { spawn } = require('child_process');
const readline = require('readline');

const RUN_DIR = process.env.BERTH_RUN_DIR || '/run/berth';
const STATUS_FILE = process.env.BERTH_STATUS_FILE || path.join(RUN_DIR, 'agent.json');
const ANSWER_FILE = process.env.BERTH_ANSWER_FILE || path.join(RUN_DIR, 'answer');
const BRIEF_FILE = process.env.BERTH_BRIEF_FILE || path.join(RUN_DIR, 'brief.md');
const BRIEF_ID = process.env.BERTH_BRIEF_ID || '';
// The MCP servers berth's capabilities publish (written by berth at Seeded).
const MCP_SERVERS_FILE = '/workspace/.berth/mcp.json';
// A question waiting for a person: written by whoever asks (the MCP permission server, or the
// codex approval handler), removed once answered.
const PENDING_FILE = path.join(RUN_DIR, 'pending.json');
const TITLE_PROMPT =
  'Summarize the following task in at most six words. Reply with the summary only, ' +
  'no punctuation at the end.\n\n';
const POLL_MS = 250;
// The CLIs run with no network but the model endpoint: no telemetry, no update checks.
const OFFLINE_ENV = {
  DISABLE_TELEMETRY: '1',
  DISABLE_AUTOUPDATER: '1',
  DISABLE_ERROR_REPORTING: '1',
  DISABLE_BUG_COMMAND: '1',
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
  CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY: '1',
  // A permission prompt waits for a person, who may take hours.
  MCP_TOOL_TIMEOUT: '2147483647',
  CODEX_DISABLE_UPDATE_CHECK: '1',
  NO_UPDATE_NOTIFIER: '1',
  // Claude Code keeps state in ~/.claude.json too; inside its home directory (berth's durable
  // volume) it survives a replaced container, and so do the sessions a resume needs.
  CLAUDE_CONFIG_DIR: process.env.CLAUDE_CONFIG_DIR || path.join(os.homedir(), '.claude'),
};

function log(line) {
  process.stdout.write(`adapter: ${line}\n`);
}

function now() {
  return new Date().toISOString().replace(/\.\d+Z$/, 'Z');
}

function writeAtomic(file, text) {
  const tmp = `${file}.tmp.${process.pid}`;
  fs.writeFileSync(tmp, text);
  fs.renameSync(tmp, file);
}

function readOr(file, fallback) {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch (e) {
    return fallback;
  }
}

function removeQuietly(file) {
  try {
    fs.unlinkSync(file);
  } catch (e) {
    /* absent */
  }
}

// At most six words of the agent's answer, on one line.
function shortTitle(text) {
  const words = String(text || '')
    .replace(/[\u0000-\u001f\u007f]/g, ' ')
    .replace(/^["'`*#\s]+|["'`*\s.]+$/g, '')
    .split(/\s+/)
    .filter(Boolean);
  return words.slice(0, 6).join(' ').slice(0, 120);
}

// The status file, rewritten whole on every change.
class Status {
  constructor() {
    this.state = null;
    this.message = '';
    this.title = '';
    this.sessionId = '';
    this.exitCode = null;
    this.pending = null;
  }

  set(changes) {
    Object.assign(this, changes);
    this.write();
  }

  write() {
    if (this.state === null) return; // not acknowledged yet
    const blocked = this.pending !== null && this.state === 'working';
    const body = {
      briefId: BRIEF_ID,
      state: blocked ? 'blocked' : this.state,
      title: this.title,
      message: blocked ? this.pending : this.message,
      sessionId: this.sessionId,
      updatedAt: now(),
    };
    if (this.exitCode !== null) body.exitCode = this.exitCode;
    writeAtomic(STATUS_FILE, JSON.stringify(body) + '\n');
  }

  // Follows the pending-question file: blocked while it holds a question.
  watchPending() {
    const timer = setInterval(() => this.checkPending(), POLL_MS);
    timer.unref();
  }

  // Reads the pending-question file now. Called also right after an answer this process
  // waited for, so a turn that ends within a poll still records that it was answered.
  checkPending() {
    let question = null;
    try {
      question = JSON.parse(fs.readFileSync(PENDING_FILE, 'utf8')).question || 'waiting for a person';
    } catch (e) {
      question = null;
    }
    if (question !== this.pending) {
      this.pending = question;
      log(question === null ? 'answered; working' : `blocked: ${question}`);
      this.write();
    }
  }
}

// Waits until a person answers through berth; the answer is consumed.
function waitForAnswer(question) {
  removeQuietly(ANSWER_FILE); // an answer from before the question answers something else
  writeAtomic(PENDING_FILE, JSON.stringify({ question }) + '\n');
  return new Promise((resolve) => {
    const timer = setInterval(() => {
      let answer;
      try {
        answer = fs.readFileSync(ANSWER_FILE, 'utf8');
      } catch (e) {
        return;
      }
      clearInterval(timer);
      removeQuietly(ANSWER_FILE);
      removeQuietly(PENDING_FILE);
      resolve(answer.trim());
    }, POLL_MS);
  });
}

// allow | deny | any other text (a denial carrying the person's words back to the agent).
function decide(answer) {
  const word = answer.trim().toLowerCase();
  if (['allow', 'yes', 'y', 'approve', 'ok'].includes(word)) return { allow: true, message: '' };
  if (['deny', 'no', 'n', 'reject'].includes(word)) {
    return { allow: false, message: 'A person denied this through berth.' };
  }
  return { allow: false, message: `A person answered through berth: ${answer}` };
}

function describeCall(tool, input) {
  let detail = '';
  if (input && typeof input === 'object') {
    detail = input.command || input.file_path || input.path || input.url || JSON.stringify(input);
  }
  detail = String(detail).replace(/\s+/g, ' ');
  if (detail.length > 140) detail = detail.slice(0, 137) + '...';
  return `allow ${tool}: ${detail}?`;
}

// Spawns the CLI with its output as lines; stderr goes to the runner log as it is.
function spawnCli(command, args, extraEnv) {
  const child = spawn(command, args, {
    env: { ...process.env, ...OFFLINE_ENV, ...extraEnv },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  child.stderr.on('data', (chunk) => process.stdout.write(chunk));
  return child;
}

function exitCodeOf(code, signal) {
  if (code !== null) return code;
  return 128 + ({ SIGHUP: 1, SIGINT: 2, SIGKILL: 9, SIGTERM: 15 }[signal] || 0);
}

// ---- Claude Code: -p --output-format stream-json ----------------------------------------------

function claudeSummary(event) {
  const parts = [];
  const content = (event.message && event.message.content) || [];
  for (const block of Array.isArray(content) ? content : []) {
    if (block.type === 'text' && block.text) parts.push(block.text.replace(/\s+/g, ' '));
    if (block.type === 'tool_use') parts.push(`[tool ${block.name}] ${JSON.stringify(block.input)}`);
    if (block.type === 'tool_result') {
      const text = typeof block.content === 'string' ? block.content : JSON.stringify(block.content);
      parts.push(`[result] ${String(text).replace(/\s+/g, ' ').slice(0, 300)}`);
    }
  }
  return parts.join(' ');
}

function askClaudeTitle(command, args, brief, status) {
  return new Promise((resolve) => {
    const child = spawnCli(command, [
      ...args,
      '-p',
      '--output-format',
      'json',
      '--no-session-persistence',
      '--tools',
      '',
    ]);
    let out = '';
    child.stdout.on('data', (chunk) => (out += chunk));
    child.stdin.end(TITLE_PROMPT + brief);
    child.on('error', () => resolve());
    child.on('close', () => {
      try {
        const title = shortTitle(JSON.parse(out).result);
        if (title) {
          log(`title: ${title}`);
          status.set({ title });
        }
      } catch (e) {
        log('the agent gave no title');
      }
      resolve();
    });
  });
}

// The MCP servers berth's capabilities publish to the CLI (`spec.capabilities: [browser]`),
// Claude Code's `mcpServers` format; none when the file is absent or unreadable.
function publishedServers() {
  const text = readOr(MCP_SERVERS_FILE, '');
  if (!text) return {};
  try {
    const servers = JSON.parse(text).mcpServers || {};
    const out = {};
    for (const [name, server] of Object.entries(servers)) {
      if (name === 'berth' || !/^[A-Za-z0-9_-]+$/.test(name)) continue;
      if (!server || typeof server.command !== 'string') continue;
      out[name] = {
        type: 'stdio',
        command: server.command,
        args: Array.isArray(server.args) ? server.args.map(String) : [],
      };
    }
    return out;
  } catch (e) {
    log(`${MCP_SERVERS_FILE} is not valid JSON; no published MCP server (${e.message})`);
    return {};
  }
}

function runClaude(command, args) {
  const status = new Status();
  status.watchPending();
  const brief = readOr(BRIEF_FILE, '');
  const resume = process.env.BERTH_RESUME_SESSION || '';
  const published = publishedServers();
  const mcpConfig = {
    mcpServers: {
      ...published,
      berth: {
        type: 'stdio',
        command: process.execPath,
        args: [__filename, 'mcp-permission'],
        env: { BERTH_RUN_DIR: RUN_DIR, BERTH_ANSWER_FILE: ANSWER_FILE },
      },
    },
  };
  const cliArgs = [
    ...args,
    '-p',
    '--output-format',
    'stream-json',
    '--verbose',
    '--mcp-config',
    JSON.stringify(mcpConfig),
    '--permission-prompt-tool',
    'mcp__berth__permission',
  ];
  // A capability the project asked for is the agent's to use: its tools need no permission.
  const allowed = Object.keys(published).map((name) => `mcp__${name}`);
  if (allowed.length) {
    cliArgs.push('--allowedTools', allowed.join(','));
    log(`published MCP servers: ${Object.keys(published).join(', ')}`);
  }
  if (resume) cliArgs.push('--resume', resume);
  log(`starting ${command}${resume ? ` (resuming session ${resume})` : ''}`);
  const child = spawnCli(command, cliArgs);
  child.stdin.end(resume ? 'Continue the task you were given; pick up where you stopped.' : brief);
  let result = null;
  let titleAsked = Boolean(process.env.BERTH_TITLE_KNOWN);
  let titleDone = Promise.resolve();
  const lines = readline.createInterface({ input: child.stdout });
  lines.on('line', (line) => {
    let event;
    try {
      event = JSON.parse(line);
    } catch (e) {
      process.stdout.write(line + '\n');
      return;
    }
    if (event.session_id && event.session_id !== status.sessionId) {
      status.sessionId = event.session_id;
    }
    if (event.type === 'system' && event.subtype === 'init') {
      // The CLI has really started: the brief is acknowledged.
      log(`session ${event.session_id} started; brief ${BRIEF_ID} acknowledged`);
      status.set({ state: 'working', message: '' });
      if (!titleAsked) {
        titleAsked = true;
        titleDone = askClaudeTitle(command, args, brief, status);
      }
    } else if (event.type === 'assistant' || event.type === 'user') {
      const summary = claudeSummary(event);
      if (summary) log(`${event.type}: ${summary}`);
      if (status.state !== null) status.write();
    } else if (event.type === 'result') {
      result = event;
      log(`result (${event.subtype || 'done'}): ${String(event.result || '').replace(/\s+/g, ' ').slice(0, 500)}`);
    }
  });
  child.on('error', (e) => {
    log(`could not start ${command}: ${e.message}`);
    status.set({ state: 'failed', message: `could not start ${command}: ${e.message}`, exitCode: 127 });
    process.exit(127);
  });
  child.on('close', async (code, signal) => {
    const exitCode = exitCodeOf(code, signal);
    // An answer the permission server consumed since the last poll is recorded before the end.
    status.checkPending();
    // The title is asked alongside the work; a quick brief waits for it (a minute at most).
    await Promise.race([titleDone, new Promise((r) => setTimeout(r, 60000))]);
    const failed = exitCode !== 0 || (result !== null && result.is_error);
    const message = failed
      ? String((result && (result.result || result.subtype)) || `exited with ${exitCode}`).slice(0, 200)
      : '';
    status.pending = null;
    removeQuietly(PENDING_FILE);
    status.set({ state: failed ? 'failed' : 'done', message, exitCode });
    log(`${command} exited with ${exitCode}; brief ${BRIEF_ID} ${failed ? 'failed' : 'done'}`);
    process.exit(exitCode);
  });
  forwardSignals(child);
}

// ---- MCP server for Claude Code's --permission-prompt-tool ------------------------------------

function mcpPermission() {
  const send = (message) => process.stdout.write(JSON.stringify(message) + '\n');
  const lines = readline.createInterface({ input: process.stdin });
  lines.on('line', async (line) => {
    let req;
    try {
      req = JSON.parse(line);
    } catch (e) {
      return;
    }
    const reply = (result) => send({ jsonrpc: '2.0', id: req.id, result });
    switch (req.method) {
      case 'initialize':
        reply({
          protocolVersion: (req.params && req.params.protocolVersion) || '2024-11-05',
          capabilities: { tools: {} },
          serverInfo: { name: 'berth', version: '1' },
        });
        return;
      case 'ping':
        reply({});
        return;
      case 'tools/list':
        reply({
          tools: [
            {
              name: 'permission',
              description: 'Asks a person, through berth, whether a tool call may run.',
              inputSchema: {
                type: 'object',
                properties: {
                  tool_name: { type: 'string' },
                  input: { type: 'object' },
                  tool_use_id: { type: 'string' },
                },
                required: ['tool_name', 'input'],
              },
            },
          ],
        });
        return;
      case 'tools/call': {
        const args = (req.params && req.params.arguments) || {};
        const input = args.input || {};
        const answer = await waitForAnswer(describeCall(args.tool_name || 'a tool', input));
        const verdict = decide(answer);
        const decision = verdict.allow
          ? { behavior: 'allow', updatedInput: input }
          : { behavior: 'deny', message: verdict.message };
        reply({ content: [{ type: 'text', text: JSON.stringify(decision) }] });
        return;
      }
      default:
        if (req.id !== undefined) {
          send({ jsonrpc: '2.0', id: req.id, error: { code: -32601, message: `no method ${req.method}` } });
        }
    }
  });
}

// ---- Codex: app server (JSON-RPC over stdio) --------------------------------------------------

function runCodex(command, args) {
  const status = new Status();
  status.watchPending();
  const brief = readOr(BRIEF_FILE, '');
  const resume = process.env.BERTH_RESUME_SESSION || '';
  log(`starting ${command} app-server${resume ? ` (resuming thread ${resume})` : ''}`);
  // The published MCP servers as configuration overrides (TOML values: a JSON string or array
  // of strings is one).
  const overrides = [];
  for (const [name, server] of Object.entries(publishedServers())) {
    overrides.push('-c', `mcp_servers.${name}.command=${JSON.stringify(server.command)}`);
    overrides.push('-c', `mcp_servers.${name}.args=${JSON.stringify(server.args)}`);
    log(`published MCP server: ${name}`);
  }
  const child = spawnCli(command, [...args, 'app-server', ...overrides]);
  let nextId = 1;
  const waiting = new Map();
  const send = (message) => child.stdin.write(JSON.stringify(message) + '\n');
  const call = (method, params) =>
    new Promise((resolve, reject) => {
      const id = nextId++;
      waiting.set(id, { resolve, reject });
      send({ jsonrpc: '2.0', id, method, params });
    });
  let titleAsked = Boolean(process.env.BERTH_TITLE_KNOWN);
  let mainThread = '';
  let titleThread = '';
  let titleText = '';
  let finished = false;
  const finish = (state, message, exitCode) => {
    if (finished) return;
    finished = true;
    status.pending = null;
    removeQuietly(PENDING_FILE);
    status.set({ state, message, exitCode });
    log(`brief ${BRIEF_ID} ${state}`);
    child.stdin.end();
    setTimeout(() => child.kill('SIGTERM'), 2000).unref();
  };
  const approval = async (req, what) => {
    const asked = waitForAnswer(what); // writes the pending question at once
    status.checkPending(); // blocked from now, not from the next poll
    const answer = await asked;
    status.checkPending(); // answered, even when the turn ends within a poll
    const verdict = decide(answer);
    send({ jsonrpc: '2.0', id: req.id, result: { decision: verdict.allow ? 'accept' : 'decline' } });
  };
  const lines = readline.createInterface({ input: child.stdout });
  lines.on('line', (line) => {
    let msg;
    try {
      msg = JSON.parse(line);
    } catch (e) {
      process.stdout.write(line + '\n');
      return;
    }
    if (msg.id !== undefined && msg.method === undefined) {
      const w = waiting.get(msg.id);
      waiting.delete(msg.id);
      if (w) (msg.error ? w.reject(new Error(msg.error.message)) : w.resolve(msg.result));
      return;
    }
    const params = msg.params || {};
    if (msg.id !== undefined) {
      // A request of the server: approvals of a command or a file change wait for a person.
      if (msg.method === 'item/commandExecution/requestApproval') {
        const what = `allow Bash: ${params.command || params.reason || 'a command'}?`;
        log(`approval asked: ${what}`);
        approval(msg, what);
      } else if (msg.method === 'item/fileChange/requestApproval') {
        const what = `allow a file change${params.reason ? `: ${params.reason}` : ''}?`;
        log(`approval asked: ${what}`);
        approval(msg, what);
      } else {
        send({ jsonrpc: '2.0', id: msg.id, error: { code: -32601, message: `not supported: ${msg.method}` } });
      }
      return;
    }
    const thread = params.threadId || (params.thread && params.thread.id) || '';
    if (msg.method === 'item/agentMessage/delta' && thread && thread === titleThread) {
      titleText += params.delta || '';
    }
    if (msg.method === 'item/completed') {
      const item = params.item || {};
      if (thread === titleThread) {
        if (item.type === 'agentMessage' && item.text) titleText = item.text;
      } else {
        log(`${item.type || 'item'}: ${JSON.stringify(item).slice(0, 400)}`);
        if (status.state !== null) status.write();
      }
    }
    if (msg.method === 'turn/completed') {
      const turn = params.turn || {};
      if (thread && thread === titleThread) {
        const title = shortTitle(titleText);
        if (title) {
          log(`title: ${title}`);
          status.set({ title });
        }
      } else if (!thread || thread === mainThread) {
        const failed = turn.status === 'failed' || turn.status === 'interrupted';
        const error = (turn.error && turn.error.message) || turn.status || '';
        finish(failed ? 'failed' : 'done', failed ? String(error).slice(0, 200) : '', failed ? 1 : 0);
      }
    }
  });
  child.on('error', (e) => {
    log(`could not start ${command}: ${e.message}`);
    status.set({ state: 'failed', message: `could not start ${command}: ${e.message}`, exitCode: 127 });
    process.exit(127);
  });
  child.on('close', (code, signal) => {
    const exitCode = exitCodeOf(code, signal);
    if (!finished) finish('failed', `${command} app-server exited with ${exitCode}`, exitCode || 1);
    process.exit(status.state === 'done' ? 0 : exitCode || 1);
  });
  forwardSignals(child);
  (async () => {
    try {
      await call('initialize', { clientInfo: { name: 'berth', title: 'berth', version: '1' } });
      send({ jsonrpc: '2.0', method: 'initialized', params: {} });
      const cwd = process.cwd();
      const started = resume
        ? await call('thread/resume', { threadId: resume })
        : await call('thread/start', { cwd, approvalPolicy: 'on-request' });
      mainThread = started.thread.id;
      status.sessionId = mainThread;
      await call('turn/start', {
        threadId: mainThread,
        input: [{ type: 'text', text: resume ? 'Continue the task you were given.' : brief }],
      });
      log(`thread ${mainThread} started; brief ${BRIEF_ID} acknowledged`);
      status.set({ state: 'working', message: '' });
      if (!titleAsked) {
        titleAsked = true;
        const t = await call('thread/start', { cwd, approvalPolicy: 'never', sandbox: 'read-only', ephemeral: true });
        titleThread = t.thread.id;
        await call('turn/start', { threadId: titleThread, input: [{ type: 'text', text: TITLE_PROMPT + brief }] });
      }
    } catch (e) {
      log(`app server: ${e.message}`);
      finish('failed', `app server: ${e.message}`.slice(0, 200), 1);
    }
  })();
}

function forwardSignals(child) {
  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP']) {
    process.on(signal, () => child.kill(signal));
  }
}

function main(argv) {
  const [mode, protocol, dashes, command, ...args] = argv;
  if (mode === 'mcp-permission') return mcpPermission();
  if (mode !== 'run' || dashes !== '--' || !command) {
    process.stderr.write('usage: adapter run PROTOCOL -- COMMAND [ARGS...] | adapter mcp-permission\n');
    process.exit(2);
  }
  fs.mkdirSync(RUN_DIR, { recursive: true });
  removeQuietly(PENDING_FILE);
  const workdir = process.env.BERTH_WORKDIR || '/workspace';
  if (fs.existsSync(workdir)) process.chdir(workdir);
  if (protocol === 'claude-stream-json') return runClaude(command, args);
  if (protocol === 'codex-app-server') return runCodex(command, args);
  process.stderr.write(`adapter: unknown protocol ${protocol}\n`);
  process.exit(2);
}

main(process.argv.slice(2));
