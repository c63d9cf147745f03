// Drives turnstile's web console in headless Chromium (playwright-core, Debian's
// chromium). Usage: node console.cjs BASE_URL API_KEY SCREENSHOT_DIR
// The server holds the session `console-demo` (seeded by tests/tests/console.rs): a
// tool call delegated by another, a retried run and a fork. Exits non-zero, naming
// the failing step, when the page does not show what it should.
"use strict";

const path = require("path");
const fs = require("fs");

const repo = path.join(__dirname, "..", "..");
const { chromium } = require(path.join(repo, "target", "clis", "node_modules", "playwright-core"));

const [base, key, shots] = process.argv.slice(2);
const executablePath = process.env.TURNSTILE_CHROMIUM || "/usr/bin/chromium";

async function api(route, fields) {
  const options = { headers: { Authorization: `Bearer ${key}` } };
  if (fields) {
    options.method = "POST";
    options.body = new URLSearchParams(fields);
  }
  const response = await fetch(base + route, options);
  if (!response.ok) throw new Error(`${route}: ${response.status} ${await response.text()}`);
  return response.json();
}

const pageLog = [];
let current = null;

async function step(name, action) {
  try {
    await action();
    console.log(`ok: ${name}`);
  } catch (error) {
    const shown = current ? await current.evaluate(() => document.getElementById("error").textContent).catch(() => "") : "";
    console.error(`FAILED: ${name}: ${error.stack || error}\nerror shown: ${shown}\npage log:\n${pageLog.join("\n")}`);
    process.exit(1);
  }
}

(async () => {
  fs.mkdirSync(shots, { recursive: true });
  const browser = await chromium.launch({ executablePath, args: ["--no-sandbox", "--disable-gpu"] });
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  page.setDefaultTimeout(15000);
  current = page;
  page.on("console", (message) => pageLog.push(`${message.type()}: ${message.text()}`));
  page.on("pageerror", (error) => pageLog.push(`error: ${error.message}`));
  const shot = (name) => page.screenshot({ path: path.join(shots, `${name}.png`), fullPage: true });

  await step("without the key the page says to enter it (401)", async () => {
    await page.goto(`${base}/ui`);
    await page.waitForSelector("#error:not([hidden])");
    const text = await page.textContent("#error");
    if (!text.includes("API key")) throw new Error(text);
    // The banner says it all: nothing under it.
    const under = (await page.textContent("#main")).trim();
    if (under !== "") throw new Error(`under the banner: ${under}`);
    // The key's placeholder is shown whole.
    const cut = await page.evaluate(() => {
      const input = document.getElementById("key");
      const style = getComputedStyle(input);
      const context = document.createElement("canvas").getContext("2d");
      context.font = `${style.fontSize} ${style.fontFamily}`;
      const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      return context.measureText(input.placeholder).width - room;
    });
    if (cut > 0) throw new Error(`the key's placeholder is cut by ${cut}px`);
    await shot("login");
  });

  await step("with the key the list shows the session created through the API", async () => {
    await page.fill("#key", key);
    await page.press("#key", "Enter");
    await page.waitForSelector("tr.session-row >> text=console-demo");
    const row = page.locator("tr.session-row", { hasText: "console-demo" });
    const cells = await row.locator("td").allTextContents();
    if (!cells[1].includes("scripted")) throw new Error(`agent: ${cells}`);
    await shot("sessions");
  });

  await step("search by id finds the session", async () => {
    await page.fill("#search", "console-demo");
    await page.press("#search", "Enter");
    await page.waitForSelector("tr.session-row >> text=console-demo");
  });

  await step("the timeline nests a delegated tool call, shows a retry and a fork", async () => {
    await page.click("a >> text=console-demo");
    await page.waitForSelector(".run");
    const nested = await page.locator('.tool[data-tool="Task"] .tool[data-tool="Read"]').count();
    if (nested !== 1) throw new Error(`nested calls: ${nested}`);
    const retries = await page.locator(".warning.retry").count();
    if (retries < 1) throw new Error("no retry shown");
    const forks = await page.locator(".run .run .fork").count();
    if (forks !== 1) throw new Error(`forks nested under their source: ${forks}`);
    const positions = await page.locator(".run .pos").count();
    if (positions < 5) throw new Error(`journal positions shown: ${positions}`);
    // The compaction sits at its place in time: after the runs before it, before the
    // turn after it (the timeline's entries are the page's direct children).
    const order = await page.evaluate(() => [...document.querySelectorAll("#main > .run, #main > .session-item")]
      .map((node) => node.classList.contains("compaction") ? "compaction" : node.classList.contains("run") ? "run" : "session"));
    if (order.join(" ") !== "session run run compaction run") throw new Error(`timeline order: ${order}`);
    const last = await page.textContent("#main > .run:last-of-type");
    if (!last.includes("after the compaction")) throw new Error(`last run: ${last}`);
    await shot("timeline");
  });

  await step("a live run's events appear while it runs, and after a reload", async () => {
    const run = await api("/agents/scripted/runs", {
      message: "/tool First {}\n/sleep 2500\n/tool Second {}\n/reply live done",
      session_id: "console-live", stream: "false", background: "true",
    });
    await page.goto(`${base}/ui#/run/scripted/${run.run_id}`);
    await page.waitForSelector('li[data-event="ToolCallCompleted"] >> text=First');
    const during = await api(`/agents/scripted/runs/${run.run_id}`);
    if (during.status !== "RUNNING") throw new Error(`shown only once the run was ${during.status}`);
    await page.reload();
    await page.waitForSelector('li[data-event="RunCompleted"]');
    const completed = await page.locator('li[data-event="ToolCallCompleted"]').count();
    if (completed !== 2) throw new Error(`tool completions shown: ${completed}`);
    const text = await page.textContent("#run-status");
    if (!text.includes("COMPLETED")) throw new Error(text);
    // A finished run offers no cancel.
    await page.waitForSelector("#cancel", { state: "hidden" });
    await shot("run");
    await page.goto(`${base}/ui#/run/scripted/${run.run_id}`);
    await page.waitForSelector('li[data-event="RunCompleted"]');
    if (await page.isVisible("#cancel")) throw new Error("a finished run offers to cancel it");
  });

  await step("a refusal is shown: compact while a run is in flight (409), an unknown session (404)", async () => {
    const run = await api("/agents/scripted/runs", {
      message: "/sleep 30000", session_id: "console-cancel", stream: "false", background: "true",
    });
    await page.goto(`${base}/ui#/session/console-cancel`);
    await page.click("#compact");
    await page.waitForSelector("#error:not([hidden])");
    const busy = await page.textContent("#error");
    if (!busy.includes("409")) throw new Error(busy);
    await page.goto(`${base}/ui#/session/no-such-session`);
    await page.waitForSelector("#error:not([hidden])");
    const missing = await page.textContent("#error");
    if (!missing.includes("Not found")) throw new Error(missing);
    if ((await page.textContent("#main")).includes("Nothing to show")) throw new Error("a banner and 'Nothing to show.'");

    await page.goto(`${base}/ui#/run/scripted/${run.run_id}`);
    await page.waitForSelector("#cancel");
    process.env.CANCEL_RUN = run.run_id;
  });

  await step("cancel from the page ends the run CANCELLED", async () => {
    const runId = process.env.CANCEL_RUN;
    await page.click("#cancel");
    await page.waitForSelector('li[data-event="RunCancelled"]');
    const after = await api(`/agents/scripted/runs/${runId}`);
    if (after.status !== "CANCELLED") throw new Error(after.status);
    await page.waitForSelector("#cancel", { state: "hidden" });
  });

  await step("compacting from the page draws the compaction after the runs it summarises", async () => {
    await api("/agents/scripted/runs", { message: "a second turn", session_id: "console-live", stream: "false" });
    await page.goto(`${base}/ui#/session/console-live`);
    await page.waitForSelector(".run");
    await page.click("#compact");
    await page.waitForFunction(() => (document.getElementById("compact-outcome") || {}).textContent);
    const outcome = await page.textContent("#compact-outcome");
    if (!outcome.includes("compaction: compacted")) throw new Error(outcome);
    const order = await page.evaluate(() => [...document.querySelectorAll("#main > .run, #main > .session-item")]
      .map((node) => node.classList.contains("compaction") ? "compaction" : node.classList.contains("run") ? "run" : "session"));
    if (order.join(" ") !== "session run run compaction") throw new Error(`timeline order: ${order}`);
  });

  await step("metrics draw charts", async () => {
    await page.goto(`${base}/ui#/metrics`);
    await page.waitForSelector("figure.chart svg rect");
    await page.waitForSelector("table.counters >> text=turnstile_runs_started_total");
    await shot("metrics");
  });

  await step("the list fits a phone-width screen and works by keyboard", async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    await page.goto(`${base}/ui#/sessions`);
    await page.waitForSelector("tr.session-row");
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    if (overflow > 1) throw new Error(`wider than the screen by ${overflow}px`);
    await shot("sessions-phone");
    // Tab to the first session's link and open it with Enter.
    let focused = "";
    for (let i = 0; i < 20 && !focused.includes("console-"); i += 1) {
      await page.keyboard.press("Tab");
      focused = await page.evaluate(() => (document.activeElement && document.activeElement.textContent) || "");
    }
    if (!focused.includes("console-")) throw new Error("no session link reached by Tab");
    await page.keyboard.press("Enter");
    await page.waitForSelector(".run");
  });

  await browser.close();
  console.log("console: all checks passed");
})();
