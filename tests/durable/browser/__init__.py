"""The inbox in a real browser: Debian's chromium, driven by Playwright, real workers behind it."""
