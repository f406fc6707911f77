"""The web: fetching URL sources politely (robots.txt, sitemaps, conditional requests)."""
