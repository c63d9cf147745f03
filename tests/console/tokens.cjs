// The console signed in with a token (issue 31) in headless Chromium (playwright-core,
// Debian's chromium). Usage: node tokens.cjs BASE_URL ALICE_TOKEN BOB_TOKEN SCREENSHOT_DIR
// The server (jwt mode, per-user isolation) holds alice's session `alice-notes` and
// bob's `bob-notes` (seeded by tests/src/console.rs). Exits non-zero, naming the
// failing step, when the page shows what the token may not see.
"use strict";

const path = require("path");
const fs = require("fs");

const repo = path.join(__dirname, "..", "..");
const { chromium } = require(path.join(repo, "target", "clis", "node_modules", "playwright-core"));

const [base, alice, bob, shots] = process.argv.slice(2);
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

async function signIn(page, token) {
  await page.fill("#key", token);
  await page.press("#key", "Enter");
}

async function listed(page) {
  await page.waitForSelector("tr.session-row");
  return page.locator("tr.session-row td:first-child").allTextContents();
}

(async () => {
  fs.mkdirSync(shots, { recursive: true });
  const browser = await chromium.launch({ executablePath, args: ["--no-sandbox", "--disable-gpu"] });
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  page.setDefaultTimeout(15000);
  current = page;
  page.on("console", (message) => pageLog.push(`${message.type()}: ${message.text()}`));
  page.on("pageerror", (error) => pageLog.push(`error: ${error.message}`));

  await step("without a token the page asks for one (401)", async () => {
    await page.goto(`${base}/ui`);
    await page.waitForSelector("#error:not([hidden])");
    const text = await page.textContent("#error");
    if (!text.includes("token")) throw new Error(text);
  });

  await step("signed in as alice, the list shows alice's session only", async () => {
    await signIn(page, alice);
    await page.waitForSelector("tr.session-row >> text=alice-notes");
    const sessions = await listed(page);
    if (sessions.some((cell) => cell.includes("bob-notes"))) throw new Error(`bob's session listed: ${sessions}`);
    const state = await page.textContent("#key-state");
    if (state !== "signed in as alice") throw new Error(`key state: ${state}`);
    await page.screenshot({ path: path.join(shots, "login-token.png"), fullPage: true });
  });

  await step("bob's session, asked for by its address, is not found for alice", async () => {
    await page.goto(`${base}/ui#/session/bob-notes`);
    await page.waitForSelector("#error:not([hidden])");
    const text = await page.textContent("#error");
    if (!text.includes("Not found")) throw new Error(text);
    const under = (await page.textContent("#main")).trim();
    if (under.includes("notes of bob-notes")) throw new Error(`bob's turn shown: ${under}`);
  });

  await step("signed in as bob, the list shows bob's session only", async () => {
    await page.goto(`${base}/ui#/sessions`);
    await signIn(page, bob);
    await page.waitForSelector("tr.session-row >> text=bob-notes");
    const sessions = await listed(page);
    if (sessions.some((cell) => cell.includes("alice-notes"))) throw new Error(`alice's session listed: ${sessions}`);
    const state = await page.textContent("#key-state");
    if (state !== "signed in as bob") throw new Error(`key state: ${state}`);
  });

  await browser.close();
  console.log("console tokens: all checks passed");
})();
