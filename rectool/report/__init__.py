"""`rectool report`: the data a report shows, its HTML page and contact sheet, its charts."""
