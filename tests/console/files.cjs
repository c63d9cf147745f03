// A run's files in the console (issue 29) in headless Chromium (playwright-core, Debian's
// chromium). Usage: node files.cjs BASE_URL RUN_PATH SCREENSHOT_DIR
// The server's agent `coder` has workspace = "session"; its session `notes` had a turn
// that wrote notes.md and gone.txt, then the run at RUN_PATH (`coder/<run_id>`) that
// rewrote notes.md, removed gone.txt and wrote new.txt (seeded by tests/src/console.rs).
// Exits non-zero, naming the failing step, when the page does not show them.
"use strict";

const path = require("path");
const fs = require("fs");

const repo = path.join(__dirname, "..", "..");
const { chromium } = require(path.join(repo, "target", "clis", "node_modules", "playwright-core"));

const [base, runPath, shots] = process.argv.slice(2);
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

(async () => {
  fs.mkdirSync(shots, { recursive: true });
  const browser = await chromium.launch({ executablePath, args: ["--no-sandbox", "--disable-gpu"] });
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  page.setDefaultTimeout(15000);
  current = page;
  page.on("console", (message) => pageLog.push(`${message.type()}: ${message.text()}`));
  page.on("pageerror", (error) => pageLog.push(`error: ${error.message}`));

  await step("the run's page lists the files it changed, in order", async () => {
    await page.goto(`${base}/ui#/run/${runPath}`);
    await page.waitForSelector("#files details.file");
    const rows = await page.locator("#files details.file").evaluateAll((nodes) =>
      nodes.map((node) => `${node.dataset.change} ${node.dataset.path}`));
    const expected = ["modified notes.md", "removed gone.txt", "added new.txt"];
    if (JSON.stringify(rows) !== JSON.stringify(expected)) throw new Error(JSON.stringify(rows));
  });

  await step("a text file's change opens as a diff", async () => {
    await page.click("#files details[data-path='notes.md'] summary");
    await page.waitForSelector("#files details[data-path='notes.md'] pre.diff");
    const removed = await page.locator("#files details[data-path='notes.md'] pre.diff .removed").allTextContents();
    const added = await page.locator("#files details[data-path='notes.md'] pre.diff .added").allTextContents();
    if (JSON.stringify(removed) !== JSON.stringify(["- two\n"])) throw new Error(`removed ${JSON.stringify(removed)}`);
    if (JSON.stringify(added) !== JSON.stringify(["+ 2\n", "+ four\n"])) throw new Error(`added ${JSON.stringify(added)}`);
    await page.screenshot({ path: path.join(shots, "run-files.png"), fullPage: true });
  });

  await step("a removed file shows what it held, an added one what it holds", async () => {
    await page.click("#files details[data-path='gone.txt'] summary");
    await page.waitForSelector("#files details[data-path='gone.txt'] pre.diff .removed");
    const gone = await page.locator("#files details[data-path='gone.txt'] pre.diff .removed").allTextContents();
    if (JSON.stringify(gone) !== JSON.stringify(["- bye\n"])) throw new Error(JSON.stringify(gone));
    await page.click("#files details[data-path='new.txt'] summary");
    await page.waitForSelector("#files details[data-path='new.txt'] pre.diff .added");
    const added = await page.locator("#files details[data-path='new.txt'] pre.diff .added").allTextContents();
    if (JSON.stringify(added) !== JSON.stringify(["+ hi\n"])) throw new Error(JSON.stringify(added));
  });

  await browser.close();
  console.log("console files: all checks passed");
})();
