"""What the tests share: servers, clusters, fault proxies, loops, pacing and forks."""
