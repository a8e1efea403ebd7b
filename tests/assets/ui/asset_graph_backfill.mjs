// Clicks through the Dagster UI as a user backfilling epochs from the asset graph:
// Lineage -> "Materialize all…" (or one asset's "Materialize…", which adds what Dagster requires)
// -> the partition range typed in the partition box -> "Launch backfill". Prints one JSON line:
// the dialog's title, the partitions it counted and what the UI said after the launch.
//
//   node asset_graph_backfill.mjs URL FIRST LAST [ASSET] [SCREENSHOTS_DIR]
//
// Chromium is Debian's (/usr/bin/chromium); playwright-core drives it (npm install here).
import { chromium } from 'playwright-core';

const [url, first, last, asset = '', shots = ''] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const out = {};
try {
  const page = await browser.newPage({ viewport: { width: 1500, height: 950 } });
  const shot = async (name) => { if (shots) await page.screenshot({ path: `${shots}/${name}.png` }); };
  if (asset) {
    await page.goto(`${url}/assets/${asset}`, { waitUntil: 'networkidle' });
  } else {
    await page.goto(`${url}/asset-groups`, { waitUntil: 'networkidle' });
  }
  await page.getByRole('button', { name: 'Skip' }).click({ timeout: 5000 }).catch(() => {});
  await shot('1-graph');
  await page.getByRole('button', { name: asset ? /Materialize/ : /Materialize all/ }).first().click();
  // One asset of a step: the UI may ask to confirm the assets materialized with it.
  const confirm = page.getByRole('button', { name: /Confirm|Continue|Materialize/ });
  const dialog = page.getByRole('dialog');
  await dialog.waitFor({ timeout: 60000 });
  if (await dialog.getByText(/will also yield new materializations/).count()) {
    await confirm.last().click();
  }
  await dialog.getByText('Partition selection').waitFor({ timeout: 60000 });
  await dialog.getByText('Show all partitions').click({ timeout: 5000 }).catch(() => {});
  const box = dialog.locator('input[type="text"]').first();
  await box.fill(`[${first}...${last}]`);
  await box.press('Enter');
  await page.waitForTimeout(1000);
  out.title = (await dialog.getByText(/^Launch runs to materialize/).first().innerText()).trim();
  out.partitions = (await dialog.getByText(/^\d+ partitions?$/).first().innerText()).trim();
  await shot('2-dialog');
  await dialog.getByRole('button', { name: 'Launch backfill' }).click();
  const said = page.getByText(/Created backfill|backfill was not launched|unexpected error/i).first();
  await said.waitFor({ timeout: 60000 });
  out.said = (await said.innerText()).trim();
  await page.waitForTimeout(1000);
  await shot('3-launched');
  out.dialogOpen = await dialog.isVisible();
  if (asset && shots) {
    // The asset's figures per epoch, as Dagster plots them (its Plots view, by partition).
    await page.goto(`${url}/assets/${asset}`, { waitUntil: 'networkidle' });
    await page.getByRole('button', { name: 'Plots' }).click();
    await page.waitForTimeout(5000);
    await page.mouse.wheel(0, 800);
    await page.waitForTimeout(1000);
    await shot('4-plots');
  }
} catch (error) {
  out.error = String(error);
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
