"""The choices options offer, defined once, importing nothing: the CLI offers them without
loading the library (numpy, OpenCV), and the library checks against the same tuples."""

CHECK_MODES = ("structure", "decode", "none")
ENCODINGS = (".jpg", ".png")
LAYOUTS = ("images", "insightface")
