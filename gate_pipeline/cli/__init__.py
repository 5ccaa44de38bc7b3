"""gate's command line (`gate ...`): thin wrappers over the core, one line per error."""
