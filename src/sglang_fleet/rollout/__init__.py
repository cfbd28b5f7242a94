"""The fleet: who serves and who routes, the routers' API, and rolling redeploys through it."""
