"""`vaswani-export`: a trained checkpoint folder to a deployment format.

    vaswani-export ctranslate2 outputs/g2p outputs/g2p-ct2                       # float32
    vaswani-export ctranslate2 outputs/g2p outputs/g2p-ct2-int8 --quantization int8
    vaswani-export onnx outputs/g2p outputs/g2p-onnx

A missing engine, an unsupported configuration or a bad folder ends with one line `error: ...` on stderr (exit
status 1) that names the fix.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from . import MissingExportDependency, UnsupportedExport


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vaswani-export", description=(
        "Export a trained vaswani checkpoint folder to CTranslate2 or to ONNX (optimum's seq2seq layout). "
        "Needs the export extra: pip install \"vaswani[export]\"."))
    formats = parser.add_subparsers(dest="format", required=True, metavar="{ctranslate2,onnx}")
    ct2 = formats.add_parser("ctranslate2", help="a model for ctranslate2.Translator (float32, int8, ...)")
    ct2.add_argument("model", help="a folder written by save_pretrained (model + tokenizer), or a Hub id")
    ct2.add_argument("output_dir", help="a new or empty folder")
    ct2.add_argument("--quantization", default="float32",
                     choices=["float32", "int8", "int8_float32", "int16", "float16", "bfloat16"],
                     help="the weights' type in the saved model (default float32)")
    ct2.add_argument("--max_positions", type=int, default=None,
                     help="rows of the position table, the longest source or output CTranslate2 can take "
                          "(default: the larger of 1024 and the model's max_position_embeddings)")
    ct2.add_argument("--force", action="store_true", help="write into a folder that is not empty")
    onnx = formats.add_parser("onnx", help="encoder_model.onnx, decoder_model.onnx, decoder_with_past_model.onnx")
    onnx.add_argument("model", help="a folder written by save_pretrained (model + tokenizer), or a Hub id")
    onnx.add_argument("output_dir", help="a new or empty folder")
    onnx.add_argument("--force", action="store_true", help="write into a folder that is not empty")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import transformers

    from vaswani.training.generation import CheckpointError

    transformers.logging.disable_progress_bar()  # stderr stays for errors

    try:
        with warnings.catch_warnings():  # the exporter's notes on axis names and deprecations are not the user's
            warnings.simplefilter("ignore")
            if args.format == "ctranslate2":
                from .ctranslate2_export import export_ctranslate2

                if args.max_positions is not None and args.max_positions < 1:
                    raise ValueError(f"--max_positions={args.max_positions} must be >= 1")
                out = export_ctranslate2(args.model, args.output_dir, args.quantization, args.max_positions,
                                         force=args.force)
            else:
                from .onnx_export import export_onnx

                out = export_onnx(args.model, args.output_dir, force=args.force)
    except (MissingExportDependency, UnsupportedExport, CheckpointError, FileExistsError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"wrote {out}")
    return 0
