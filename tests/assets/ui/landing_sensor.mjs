// Looks at the landing sensor as a user does: its page (the ticks, each with what it requested
// or why it skipped) and its latest tick's log ("View logs"), then the Runs list. Prints one
// JSON line: the lines of the tick's log dialog, and the Runs list's rows (ID, partition, tags,
// target, launched by, status...), once a run of PARTITION shows there.
//
//   node landing_sensor.mjs URL SENSOR_PATH PARTITION [SCREENSHOTS_DIR]
//
// SENSOR_PATH is the sensor's page under URL (locations/<repository>@<location>/sensors/<name>).
import { chromium } from 'playwright-core';

const [url, sensorPath, partition, shots = ''] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const out = {};
try {
  const page = await browser.newPage({ viewport: { width: 1500, height: 950 } });
  const shot = async (name) => { if (shots) await page.screenshot({ path: `${shots}/${name}.png`, fullPage: true }); };
  await page.goto(`${url}/${sensorPath}`, { waitUntil: 'networkidle' });
  await page.getByRole('button', { name: 'Skip' }).click({ timeout: 5000 }).catch(() => {});
  await page.getByText('View logs').first().waitFor({ timeout: 60000 });
  await shot('1-sensor');
  // The latest tick's log, as its "View logs" button shows it.
  await page.getByText('View logs').first().click();
  const dialog = page.getByRole('dialog');
  await dialog.waitFor({ timeout: 60000 });
  await page.waitForTimeout(2000);
  await shot('2-tick-log');
  out.log = (await dialog.innerText()).split('\n').map((l) => l.trim()).filter(Boolean);
  await page.keyboard.press('Escape');
  // The Runs list: each run's row of the partition asked for.
  await page.goto(`${url}/runs`, { waitUntil: 'networkidle' });
  await page.getByText(`partition: ${partition}`).first().waitFor({ timeout: 60000 });
  await shot('3-runs');
  // A run's row: the nearest block around its partition tag that holds the row's checkbox.
  const tags = page.getByText(/^partition: /);
  out.runs = [];
  for (const tag of await tags.all()) {
    const row = tag.locator('xpath=ancestor::*[.//input[@type="checkbox"]][1]');
    out.runs.push((await row.innerText()).replace(/\s+/g, ' ').trim());
  }
} catch (error) {
  out.error = String(error);
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
