"""vaswani-plot-attention and training/attention_plots.py, on a tiny checkpoint."""

import numpy as np

from vaswani.training import attention_plots


def test_plot_attention_writes_three_pngs(checkpoint, tmp_path, capsys):
    args = attention_plots.build_parser().parse_args([str(checkpoint), "TRANSFORMER", "--output_dir", str(tmp_path),
                                                      "--max_new_tokens", "6"])
    maps, paths = attention_plots.plot_checkpoint(args)
    printed = capsys.readouterr().out.split()
    assert printed == [str(p) for p in paths]
    assert sorted(p.name for p in paths) == ["cross_attention.png", "decoder_self_attention.png",
                                             "encoder_self_attention.png"]
    for path in paths:
        data = path.read_bytes()
        assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"

    layers, heads = 2, 4
    source, decoder = len(maps.source_tokens), len(maps.decoder_tokens)
    assert maps.source_tokens[:3] == ["T", "R", "A"] and maps.source_tokens[-1] == "</s>"
    assert maps.decoder_tokens[0] == "<s>" and maps.decoder_tokens[1:] == maps.output_tokens[:-1]
    assert len(maps.output_tokens) == decoder <= 6
    for kind, shape in [("encoder_self_attention", (source, source)), ("decoder_self_attention", (decoder, decoder)),
                        ("cross_attention", (decoder, source))]:
        weights = getattr(maps, kind)
        assert weights.shape == (layers, heads, *shape)
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
        rows, columns = maps.axes(kind)
        assert (len(rows), len(columns)) == shape
    # decoder self-attention is causal: nothing above the diagonal
    assert np.abs(np.triu(maps.decoder_self_attention, k=1)).max() == 0.0


def test_plot_attention_per_layer(loaded, tmp_path):
    from vaswani.training.attention_plots import attention_maps, save_attention_plots

    model, tokenizer = loaded
    maps = attention_maps(model, tokenizer, "AB", max_new_tokens=3)
    paths = save_attention_plots(maps, tmp_path, per_layer=True, prefix="ab_")
    assert [p.name for p in paths] == [f"ab_{kind}_layer{i}.png" for kind in
                                       ("encoder_self_attention", "decoder_self_attention", "cross_attention")
                                       for i in range(2)]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_plot_attention_shows_each_pattern(loaded, tmp_path):
    """A local encoder's maps are a band, a block-sparse decoder's are blocks with a global column, zero elsewhere;
    linear attention's implied weights are rows that sum to one; the titles name the patterns."""
    from vaswani import VaswaniForConditionalGeneration
    from vaswani.training.attention_plots import attention_maps, save_attention_plots

    model, tokenizer = loaded
    for encoder, decoder in (("local", "block_sparse"), ("linear", "linear")):
        config = model.config.to_dict()
        config.update(encoder_attention_pattern=encoder, decoder_attention_pattern=decoder, attention_window=1,
                      sparse_block_size=2, sparse_global_tokens=1)
        patterned = VaswaniForConditionalGeneration(type(model.config).from_dict(config))
        patterned.load_state_dict(model.state_dict())
        maps = attention_maps(patterned, tokenizer, "TRANSFORMERS", max_new_tokens=8)
        source, target = maps.encoder_self_attention, maps.decoder_self_attention
        np.testing.assert_allclose(source.sum(-1), 1.0, atol=1e-5)
        np.testing.assert_allclose(target.sum(-1), 1.0, atol=1e-5)
        if encoder == "local":
            i, j = np.indices(source.shape[-2:])
            assert source[..., np.abs(i - j) > 1].max() == 0.0 and source[..., np.abs(i - j) <= 1].min() > 0.0
            i, j = np.indices(target.shape[-2:])
            outside = (np.abs(i // 2 - j // 2) > 1) & (j > 0) & (i > 0) | (j > i)
            assert target[..., outside].max() == 0.0 and target[..., ~outside].min() > 0.0
            assert "local attention, window 1" in maps.patterns["encoder_self_attention"]
        else:
            assert maps.patterns["decoder_self_attention"] == "linear attention, implied weights"
            assert np.abs(np.triu(target, k=1)).max() == 0.0
        assert len(save_attention_plots(maps, tmp_path / encoder)) == 3
