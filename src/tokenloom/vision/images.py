"""The bundled image+text set: real photographs shipped inside the scikit-image wheel, with
prompts and responses written for tokenloom.

scikit-image 0.26.0 carries about twenty sample images in ``skimage/data/`` inside its wheel (no
download; most are CC0 or public domain, see its ``_fetchers.py``). Installed with
``pip install --no-deps -r requirements/images.txt``: tokenloom finds the folder with
``importlib`` and reads the files with Pillow; it never imports scikit-image, whose own
dependencies are not needed.

:func:`build_image_set` writes one Parquet file of (image JPEG bytes, prompt, response, text)
rows — three question/answer pairs per image, each image re-encoded at most
``max_side`` pixels — ready for ``tokenloom ingest``: the image column is a binary Parquet column,
so it becomes a Lance blob column.
"""

from __future__ import annotations

import importlib.util
import io
import os
from dataclasses import dataclass

from tokenloom.errors import CorpusError, require

__all__ = ["IMAGES", "ImageItem", "image_dir", "build_image_set", "CORRUPT_JPEG"]

CORRUPT_JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 32
"""A JPEG header followed by nothing: Pillow cannot decode it (the demo's bad image)."""


@dataclass(frozen=True)
class ImageItem:
    """One bundled image and what we say about it."""

    file: str
    """File name in ``skimage/data/``."""
    caption: str
    """A one-sentence description (the answer to "Describe the image.")."""
    qa: tuple[tuple[str, str], ...]
    """Two more (question, answer) pairs."""


IMAGES: tuple[ImageItem, ...] = (
    ImageItem(
        "astronaut.png",
        "A smiling astronaut in an orange flight suit poses beside an American flag and a model "
        "space shuttle.",
        (
            ("What is the person wearing?", "An orange astronaut flight suit with patches."),
            ("Is there a flag in the picture?", "Yes, an American flag hangs behind her."),
        ),
    ),
    ImageItem(
        "camera.png",
        "A black and white photo of a man in a coat standing behind a camera on a tripod.",
        (
            ("Is this image in colour?", "No, it is a grayscale photograph."),
            ("What is the man doing?", "He is looking through a camera mounted on a tripod."),
        ),
    ),
    ImageItem(
        "chelsea.png",
        "A tabby cat with green eyes looks to the side against a light background.",
        (
            ("What animal is this?", "A cat, a striped tabby."),
            ("What colour are its eyes?", "Its eyes are green."),
        ),
    ),
    ImageItem(
        "coffee.png",
        "A red cup of black coffee on a red saucer with a spoon, on a wooden table.",
        (
            ("What drink is shown?", "A cup of black coffee."),
            ("Is there a spoon?", "Yes, a spoon rests on the saucer."),
        ),
    ),
    ImageItem(
        "coins.png",
        "Two dozen old coins lie in rows on a dark background, in grayscale.",
        (
            ("What objects are shown?", "Coins, arranged in rows."),
            ("How many coins are there, roughly?", "About twenty-four."),
        ),
    ),
    ImageItem(
        "rocket.jpg",
        "A rocket stands on its launch pad at dusk, between lit service towers.",
        (
            ("What vehicle is shown?", "A rocket on a launch pad."),
            ("What time of day is it?", "Dusk: the sky is dark blue and the pad lights are on."),
        ),
    ),
    ImageItem(
        "hubble_deep_field.jpg",
        "Hundreds of distant galaxies of many shapes and colours shine against black space.",
        (
            ("Where was this photographed?", "In deep space, by the Hubble telescope."),
            ("What are the bright spots?", "Galaxies, each holding billions of stars."),
        ),
    ),
    ImageItem(
        "retina.jpg",
        "A photograph of the back of a human eye, showing red retina and branching vessels.",
        (
            ("What organ is shown?", "The retina at the back of an eye."),
            ("What are the dark lines?", "Blood vessels branching out from the optic disc."),
        ),
    ),
    ImageItem(
        "moon.png",
        "A grayscale close-up of the moon's surface, covered with craters.",
        (
            ("What surface is this?", "The surface of the moon."),
            ("What are the round marks?", "Impact craters."),
        ),
    ),
    ImageItem(
        "brick.png",
        "A grayscale texture of a brick wall with mortar lines between the bricks.",
        (
            ("What material is this?", "Bricks laid in a wall."),
            ("Is it in colour?", "No, the texture is grayscale."),
        ),
    ),
    ImageItem(
        "grass.png",
        "A grayscale texture of dense grass blades.",
        (
            ("What plant is shown?", "Grass, seen up close."),
            ("Are there any animals?", "No, only grass."),
        ),
    ),
    ImageItem(
        "gravel.png",
        "A grayscale texture of small gravel stones packed together.",
        (
            ("What is on the ground?", "Gravel, many small stones."),
            ("Is this a landscape?", "No, it is a close-up texture."),
        ),
    ),
    ImageItem(
        "motorcycle_left.png",
        "A red motorcycle stands in a cluttered workshop, seen from the left camera.",
        (
            ("What vehicle is shown?", "A motorcycle in a workshop."),
            ("What colour is it?", "Mostly red."),
        ),
    ),
    ImageItem(
        "page.png",
        "A page of printed text titled Region-based segmentation, unevenly lit.",
        (
            ("What is shown?", "A page of printed text."),
            ("Is the lighting even?", "No, one side is darker than the other."),
        ),
    ),
    ImageItem(
        "text.png",
        "Handwritten characters in a row of boxes on paper, in grayscale.",
        (
            ("Does the image contain writing?", "Yes, handwritten characters."),
            ("Is it a photograph of a landscape?", "No, it shows writing."),
        ),
    ),
    ImageItem(
        "ihc.png",
        "A microscope image of tissue stained brown and blue.",
        (
            ("What kind of image is this?", "A stained tissue sample under a microscope."),
            ("What colours dominate?", "Brown and blue stains."),
        ),
    ),
    ImageItem(
        "logo.png",
        "The scikit-image logo: a green and orange disc split by a white S-shaped curve.",
        (
            ("Is this a photograph?", "No, it is a logo drawing."),
            ("What letter does it look like?", "A large letter S."),
        ),
    ),
    ImageItem(
        "horse.png",
        "A black silhouette of a horse on a white background.",
        (
            ("What animal is shown?", "A horse, as a silhouette."),
            ("How many colours are there?", "Two: black and white."),
        ),
    ),
)
"""The bundled images with the texts written for them."""


def image_dir() -> str:
    """The folder of scikit-image's sample images (found without importing scikit-image).

    Raises:
        CorpusError: scikit-image is not installed (names the install line).
    """
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(
            "the bundled images come from the scikit-image wheel; install it with "
            "`pip install --no-deps -r requirements/images.txt`"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def _jpeg(path: str, max_side: int) -> tuple[bytes, int, int]:
    pil = require("PIL.Image", extra="vision", package="pillow")
    with pil.open(path) as im:  # type: ignore[attr-defined]
        im = im.convert("RGB")
        im.thumbnail((max_side, max_side))
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=90)
        return buf.getvalue(), im.width, im.height


def build_image_set(out: str, *, max_side: int = 128, bad_images: int = 0) -> str:
    """Write the bundled image+text set as ``out/images.parquet``; returns its path.

    Columns: ``text`` (prompt and response, for search), ``prompt``, ``response``, ``image``
    (JPEG bytes), ``width``, ``height``, ``file``, ``source`` (``"skimage"``).

    Args:
        out: Folder to write to (created).
        max_side: Longest side of each re-encoded image, pixels.
        bad_images: Extra rows whose image bytes are a truncated JPEG (for skip tests and
            demos).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = image_dir()
    rows = []
    for item in IMAGES:
        data, w, h = _jpeg(os.path.join(folder, item.file), max_side)
        for prompt, response in (("Describe the image.", item.caption), *item.qa):
            rows.append(
                {
                    "text": f"{prompt} {response}",
                    "prompt": prompt,
                    "response": response,
                    "image": data,
                    "width": w,
                    "height": h,
                    "file": item.file,
                    "source": "skimage",
                }
            )
    for i in range(bad_images):
        rows.append(
            {
                "text": f"Describe the image. A broken file number {i}.",
                "prompt": "Describe the image.",
                "response": f"A broken file number {i}.",
                "image": CORRUPT_JPEG,
                "width": 0,
                "height": 0,
                "file": f"corrupt-{i}.jpg",
                "source": "skimage",
            }
        )
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "images.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
