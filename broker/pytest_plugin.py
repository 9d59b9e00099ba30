"""fencelog's pytest plugin (entry point pytest11): fixtures for the tests of fencelog's
users. Placeholder until the plugin lands: it registers nothing yet."""
