#pragma once
// rope.Config.key, read in C++.
//
// A rope.Config crosses the PyTorch operator's boundary as its key: a JSON
// object (python/rope/_config.py: json.dumps(Config._as_dict(), sort_keys=True))
// with the fields head_dim, rotary_dim, base, style, precise_angles,
// mrope_section, mrope_interleaved, axial_sections, and scaling (HuggingFace's
// keys: rope_type, factor, original_max_position_embeddings, attention_factor,
// beta_fast, beta_slow, truncate, mscale, mscale_all_dim, low_freq_factor,
// high_freq_factor, short_factor, long_factor). The operator's C++ kernel
// needs the rope::RopeConfig without running Python, and Config.from_key
// needs the same; both read the key here, so they cannot disagree.
#include <string_view>

#include <rope/config.hpp>

namespace rope_python {

/// The validated rope::RopeConfig that @p key describes. A field left out takes
/// rope.Config's default. Throws rope::Error naming the field for a key that
/// is not such a JSON object, an unknown or mistyped field, or a configuration
/// rope::validate refuses.
rope::RopeConfig config_from_key(std::string_view key);

}  // namespace rope_python
