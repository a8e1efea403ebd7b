#!/usr/bin/env bash
# Spark 4 needs a Java runtime of version 17 or later; say so clearly when there is none.
set -euo pipefail
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
  echo "wcoj: Java 17 or later is required by Spark, and no 'java' was found." >&2
  echo "      Install one (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or set JAVA_HOME." >&2
  exit 1
fi
version=$("$java_bin" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
major=${version%%.*}
[ "$major" = "1" ] && major=$(echo "$version" | cut -d. -f2)
if ! [ "$major" -ge 17 ] 2>/dev/null; then
  echo "wcoj: Java 17 or later is required by Spark; found Java $version at $(command -v "$java_bin")." >&2
  exit 1
fi
