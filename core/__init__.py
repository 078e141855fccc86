"""The domain core both the API and the workers use: rendering and template lookup, the rate
limiter, preference resolution, header safety. It imports only ``schema``."""
