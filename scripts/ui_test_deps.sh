#!/usr/bin/env bash
# Installs what the browser test (tests/assets/test_ui_backfill.py) needs: Debian's Chromium and
# playwright-core from npm. Best effort: where either cannot be installed, the test skips and says
# which is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  timeout 600 apt-get update -qq && timeout 900 apt-get install -y -qq --no-install-recommends chromium >/dev/null \
    || echo "ui-test-deps: chromium could not be installed"
fi
if command -v npm >/dev/null 2>&1 && [ ! -d tests/assets/ui/node_modules/playwright-core ]; then
  timeout 600 npm --prefix tests/assets/ui ci --no-audit --no-fund --silent \
    || echo "ui-test-deps: playwright-core could not be installed"
fi
exit 0
