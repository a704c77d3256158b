"""`rectool.packer.images.transform_from_options`: im2rec's re-encoding options, defaults."""

from __future__ import annotations

import pytest

from rectool.errors import UsageError
from rectool.packer.images import Transform, transform_from_options


def test_no_reencoding_option_means_pass_through():
    assert transform_from_options() is None
    assert transform_from_options(resize=None, center_crop=False, quality=None) is None


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"resize": 112}, Transform(112, False, 95, ".jpg", 1)),
        ({"encoding": ".png"}, Transform(0, False, 3, ".png", 1)),
        ({"center_crop": True, "quality": 80}, Transform(0, True, 80, ".jpg", 1)),
        ({"color": "-1", "encoding": ".png", "quality": 9}, Transform(0, False, 9, ".png", -1)),
    ],
)
def test_any_reencoding_option_takes_the_defaults_of_its_encoding(options, expected):
    assert transform_from_options(**options) == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quality": 50, "encoding": ".png"}, "--quality 50: PNG compression must be 0-9"),
        ({"quality": 0}, "--quality 0: JPEG quality must be 1-100"),
        ({"encoding": ".gif"}, "--encoding must be one of .jpg, .png, got '.gif'"),
        ({"color": 2}, "--color must be -1, 0 or 1, got 2"),
    ],
)
def test_reencoding_options_that_do_not_fit_name_the_option(options, message):
    with pytest.raises(UsageError) as error:
        transform_from_options(**options)
    assert str(error.value).startswith(message)
