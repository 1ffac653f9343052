// rope.Config.key read in C++: see config_key.hpp.
//
// The key is JSON written by Python's json module, so a small reader of that
// subset suffices (objects, arrays, strings, numbers, true, false, null); each
// field is read as the type its RopeConfig field has, and anything else is a
// rope::Error naming the field.
#include "config_key.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <rope/error.hpp>

namespace rope_python {
namespace {

class KeyReader {
public:
    explicit KeyReader(std::string_view text) : text_(text) {}

    /// Reads an object, calling @p field(name) with the reader at each member's value.
    template <typename Field>
    void object(const std::string& where, Field&& field) {
        expect('{', where);
        if (consume('}')) return;
        do {
            const std::string name = string(where);
            expect(':', where);
            field(name);
        } while (consume(','));
        expect('}', where);
    }

    /// True (and the null consumed) when the next value is null.
    bool null() { return literal("null"); }

    bool boolean(const std::string& where) {
        if (literal("true")) return true;
        if (literal("false")) return false;
        wrong(where, "must be true or false");
    }

    std::string string(const std::string& where) {
        skip_space();
        if (!consume_here('"')) wrong(where, "must be a string");
        std::string out;
        while (at_ < text_.size() && text_[at_] != '"') {
            if (text_[at_] == '\\') wrong(where, "must be a string without escapes");
            out += text_[at_++];
        }
        if (!consume_here('"')) wrong(where, "is an unterminated string");
        return out;
    }

    double number(const std::string& where) {
        skip_space();
        double value = 0;
        const char* begin = text_.data() + at_;
        const auto [end, error] = std::from_chars(begin, text_.data() + text_.size(), value);
        if (error != std::errc()) wrong(where, "must be a number");
        at_ += size_t(end - begin);
        return value;
    }

    int64_t integer(const std::string& where) {
        const size_t start = at_;
        const double value = number(where);
        if (value != std::floor(value) || std::fabs(value) > 9.0e15) {
            at_ = start;
            wrong(where, "must be an integer");
        }
        return int64_t(value);
    }

    template <typename Value, typename Read>
    std::vector<Value> list(const std::string& where, Read&& read) {
        std::vector<Value> values;
        expect('[', where);
        if (consume(']')) return values;
        do {
            values.push_back(read(where + "[" + std::to_string(values.size()) + "]"));
        } while (consume(','));
        expect(']', where);
        return values;
    }

    void end() {
        skip_space();
        if (at_ != text_.size()) wrong("config", "has text after its JSON object");
    }

    /// rope::Error naming @p where, quoting the key from the current character.
    [[noreturn]] void wrong(const std::string& where, const std::string& reason) const {
        std::string excerpt(text_.substr(at_, 40));
        if (at_ + 40 < text_.size()) excerpt += "...";
        rope::fail(where, "'" + excerpt + "' (character " + std::to_string(at_) + ")",
                   reason + "; config must be a rope.Config.key");
    }

private:
    void skip_space() {
        while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\t' ||
                                      text_[at_] == '\r'))
            ++at_;
    }
    bool consume_here(char c) {
        if (at_ < text_.size() && text_[at_] == c) {
            ++at_;
            return true;
        }
        return false;
    }
    bool consume(char c) {
        skip_space();
        return consume_here(c);
    }
    void expect(char c, const std::string& where) {
        if (!consume(c)) wrong(where, std::string("expected '") + c + "'");
    }
    bool literal(std::string_view word) {
        skip_space();
        if (text_.substr(at_, word.size()) != word) return false;
        at_ += word.size();
        return true;
    }

    std::string_view text_;
    size_t at_ = 0;
};

void read_scaling(KeyReader& r, rope::Scaling& s) {
    r.object("config.scaling", [&](const std::string& name) {
        const std::string where = "config.scaling." + name;
        if (r.null()) return;  // An unset optional (HuggingFace writes null for it, too).
        auto number = [&](const std::string& w) { return r.number(w); };
        if (name == "rope_type") s.type = rope::parse_scaling_type(r.string(where));
        else if (name == "factor") s.factor = r.number(where);
        else if (name == "original_max_position_embeddings") s.original_max_position_embeddings = r.integer(where);
        else if (name == "attention_factor") s.attention_factor = r.number(where);
        else if (name == "beta_fast") s.beta_fast = r.number(where);
        else if (name == "beta_slow") s.beta_slow = r.number(where);
        else if (name == "truncate") s.truncate = r.boolean(where);
        else if (name == "mscale") s.mscale = r.number(where);
        else if (name == "mscale_all_dim") s.mscale_all_dim = r.number(where);
        else if (name == "low_freq_factor") s.low_freq_factor = r.number(where);
        else if (name == "high_freq_factor") s.high_freq_factor = r.number(where);
        else if (name == "short_factor") s.short_factor = r.list<double>(where, number);
        else if (name == "long_factor") s.long_factor = r.list<double>(where, number);
        else r.wrong(where, "is not a field of rope.Config.scaling");
    });
}

}  // namespace

rope::RopeConfig config_from_key(std::string_view key) {
    KeyReader r(key);
    rope::RopeConfig config;
    std::optional<std::vector<int64_t>> mrope_section, axial_sections;
    bool mrope_interleaved = false;
    auto integer = [&](const std::string& where) { return r.integer(where); };
    r.object("config", [&](const std::string& name) {
        const std::string where = "config." + name;
        if (r.null()) return;  // rope.Config's default, as Config(name=None) takes it.
        if (name == "head_dim") config.head_dim = r.integer(where);
        else if (name == "rotary_dim") config.rotary_dim = r.integer(where);
        else if (name == "rotary_offset") config.rotary_offset = r.integer(where);
        else if (name == "base") config.base = r.number(where);
        else if (name == "style") config.style = rope::parse_style(r.string(where));
        else if (name == "precise_angles") config.precise_angles = r.boolean(where);
        else if (name == "scaling") read_scaling(r, config.scaling);
        else if (name == "mrope_section") mrope_section = r.list<int64_t>(where, integer);
        else if (name == "mrope_interleaved") mrope_interleaved = r.boolean(where);
        else if (name == "axial_sections") axial_sections = r.list<int64_t>(where, integer);
        else r.wrong(where, "is not a field of rope.Config");
    });
    r.end();
    // The same rules as rope.Config's constructor (python/rope/_config.py).
    const bool has_mrope = mrope_section && !mrope_section->empty();
    const bool has_axial = axial_sections && !axial_sections->empty();
    if (has_mrope && has_axial) rope::fail("config.axial_sections", "set", "give mrope_section or axial_sections, not both");
    if (has_mrope) {
        config.multi_axis.assignment =
            mrope_interleaved ? rope::AxisAssignment::mrope_interleaved : rope::AxisAssignment::mrope_contiguous;
        config.multi_axis.sections = *mrope_section;
    } else if (mrope_interleaved) {
        rope::fail("config.mrope_interleaved", true, "needs mrope_section");
    } else if (has_axial) {
        config.multi_axis.assignment = rope::AxisAssignment::axial;
        config.multi_axis.sections = *axial_sections;
    }
    rope::validate(config);
    return config;
}

}  // namespace rope_python
