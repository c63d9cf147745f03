// Times the console's sessions page: node load.cjs BASE_URL LOADS prints, one a line,
// the milliseconds from navigation to its first page of rows (a fresh page each time).
"use strict";

const path = require("path");
const { chromium } = require(path.join(__dirname, "..", "..", "target", "clis", "node_modules", "playwright-core"));

const [base, loads] = process.argv.slice(2);

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.TURNSTILE_CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu"],
  });
  for (let i = 0; i < Number(loads); i += 1) {
    const page = await browser.newPage();
    const started = Date.now();
    await page.goto(`${base}/ui#/sessions`);
    await page.waitForFunction(() => document.querySelectorAll("tr.session-row").length >= 20, null, { timeout: 60000 });
    console.log(Date.now() - started);
    await page.close();
  }
  await browser.close();
})();
