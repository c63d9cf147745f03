// The console's approvals (issue 30) in headless Chromium (playwright-core, Debian's
// chromium). Usage: node approvals.cjs BASE_URL SCREENSHOT_DIR
// The server's agent `coder` has approvals = ["Bash"]; sessions `deploy` and `cleanup`
// each have a run paused on a Bash call (seeded by tests/src/console.rs).
// Exits non-zero, naming the failing step, when the page does not list them or the
// buttons do not decide them.
"use strict";

const path = require("path");
const fs = require("fs");

const repo = path.join(__dirname, "..", "..");
const { chromium } = require(path.join(repo, "target", "clis", "node_modules", "playwright-core"));

const [base, shots] = process.argv.slice(2);
const executablePath = process.env.TURNSTILE_CHROMIUM || "/usr/bin/chromium";

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

async function runStatus(page, runId) {
  return page.evaluate(async (id) => (await (await fetch(`/agents/coder/runs/${id}`)).json()), runId);
}

async function until(what, check) {
  for (let i = 0; i < 200; i++) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`never: ${what}`);
}

(async () => {
  fs.mkdirSync(shots, { recursive: true });
  const browser = await chromium.launch({ executablePath, args: ["--no-sandbox", "--disable-gpu"] });
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  page.setDefaultTimeout(15000);
  current = page;
  page.on("console", (message) => pageLog.push(`${message.type()}: ${message.text()}`));
  page.on("pageerror", (error) => pageLog.push(`error: ${error.message}`));

  let rows = [];
  await step("the approvals page lists the paused runs' calls, oldest first", async () => {
    await page.goto(`${base}/ui`);
    await page.click("nav a[href='#/approvals']");
    await page.waitForSelector("tr.approval");
    rows = await page.locator("tr.approval").evaluateAll((nodes) => nodes.map((node) => ({
      run: node.dataset.run, text: node.textContent })));
    if (rows.length !== 2) throw new Error(JSON.stringify(rows));
    if (!rows[0].text.includes("make deploy") || !rows[1].text.includes("rm -rf build")) throw new Error(JSON.stringify(rows));
    await page.screenshot({ path: path.join(shots, "approvals.png"), fullPage: true });
  });

  await step("Approve lets the first run go on: it runs its call and completes", async () => {
    await page.click(`tr.approval[data-run='${rows[0].run}'] button.approve`);
    await page.waitForFunction((run) => !document.querySelector(`tr.approval[data-run='${run}']`), rows[0].run);
    await until("the approved run completes", async () => (await runStatus(page, rows[0].run)).status === "COMPLETED");
    const run = await runStatus(page, rows[0].run);
    if (run.tools[0].confirmed !== true || run.tools[0].result !== "ok:Bash") throw new Error(JSON.stringify(run.tools));
  });

  await step("Deny with a note: the call never runs and its result carries the note", async () => {
    await page.fill(`tr.approval[data-run='${rows[1].run}'] input.note`, "keep the build");
    await page.click(`tr.approval[data-run='${rows[1].run}'] button.deny`);
    await page.waitForSelector("p.empty");
    await until("the denied run completes", async () => (await runStatus(page, rows[1].run)).status === "COMPLETED");
    const run = await runStatus(page, rows[1].run);
    if (run.tools[0].confirmed !== false || !run.tools[0].result.includes("keep the build")) throw new Error(JSON.stringify(run.tools));
  });

  await browser.close();
  console.log("console approvals: all checks passed");
})();
