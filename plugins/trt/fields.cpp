#include "fields.h"

#include <cstring>

#include "plugin_base.h"  // concat

namespace padfree {
namespace trt {
namespace {

using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;

constexpr char kMagic[4] = {'P', 'F', 'T', 'R'};
// A plugin name longer than this in a blob can only be corruption (TensorRT caps names at 1024).
constexpr uint32_t kMaxNameLength = 1024;

const char* type_name(PluginFieldType type) {
    switch (type) {
        case PluginFieldType::kINT32: return "int32";
        case PluginFieldType::kFLOAT32: return "float32";
        case PluginFieldType::kUNKNOWN: return "bytes";
        default: return "another type";
    }
}

class ByteWriter {
public:
    void bytes(const void* data, size_t size) {
        const auto* p = static_cast<const uint8_t*>(data);
        out_.insert(out_.end(), p, p + size);
    }
    void u32(uint32_t value) { bytes(&value, sizeof(value)); }
    std::vector<uint8_t> take() { return std::move(out_); }

private:
    std::vector<uint8_t> out_;
};

// Never reads past `size`: each read first checks what is left and records why it stopped.
class ByteReader {
public:
    ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

    bool bytes(void* out, size_t size, const char* what) {
        if (size > size_ - pos_) {
            error_ = concat("truncated: ", what, " needs ", size, " bytes at offset ", pos_, ", only ",
                            size_ - pos_, " left");
            return false;
        }
        std::memcpy(out, data_ + pos_, size);
        pos_ += size;
        return true;
    }
    bool u32(uint32_t& out, const char* what) { return bytes(&out, sizeof(out), what); }
    size_t left() const { return size_ - pos_; }
    const std::string& error() const { return error_; }

private:
    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
    std::string error_;
};

bool fail(std::string& error, const std::string& message) {
    error = message;
    return false;
}

}  // namespace

bool parse_named_fields(const Schema& schema, const PluginFieldCollection* fc,
                        std::vector<Scalar>& values, std::string& error) {
    values.assign(schema.fields.size(), Scalar{0});
    std::vector<bool> seen(schema.fields.size(), false);
    const int32_t count = fc ? fc->nbFields : 0;
    if (count < 0 || (count > 0 && fc->fields == nullptr))
        return fail(error, "malformed field collection");
    for (int32_t k = 0; k < count; ++k) {
        const PluginField& field = fc->fields[k];
        if (field.name == nullptr) return fail(error, "a field without a name");
        const std::string name = field.name;
        if (name == "plugin_version" || name == "plugin_namespace") continue;
        size_t index = 0;
        while (index < schema.fields.size() && name != schema.fields[index].name) ++index;
        if (index == schema.fields.size()) {
            std::string takes;
            for (const FieldSpec& spec : schema.fields) takes += concat(" ", spec.name);
            if (schema.fields.empty()) takes = " no fields";
            return fail(error, concat("unknown field '", name, "'; ", schema.plugin_name, " takes:", takes));
        }
        const FieldSpec& spec = schema.fields[index];
        if (seen[index]) return fail(error, "field '" + name + "' given twice");
        if (field.type != spec.type || field.length != 1 || field.data == nullptr)
            return fail(error, concat("field '", name, "': expected one ", type_name(spec.type), ", got ",
                                      field.length, " x ", type_name(field.type)));
        std::memcpy(&values[index], field.data, sizeof(Scalar));
        seen[index] = true;
    }
    for (size_t index = 0; index < schema.fields.size(); ++index) {
        if (seen[index]) continue;
        if (!schema.fields[index].has_default)
            return fail(error, std::string("missing field '") + schema.fields[index].name + "'");
        values[index] = schema.fields[index].default_value;
    }
    return true;
}

std::vector<uint8_t> encode_state(const Schema& schema, const std::vector<Scalar>& values) {
    ByteWriter out;
    out.bytes(kMagic, sizeof(kMagic));
    out.u32(kStateFormatVersion);
    const uint32_t name_length = static_cast<uint32_t>(std::strlen(schema.plugin_name));
    out.u32(name_length);
    out.bytes(schema.plugin_name, name_length);
    out.u32(static_cast<uint32_t>(schema.fields.size()));
    for (size_t index = 0; index < schema.fields.size(); ++index) {
        out.u32(static_cast<uint32_t>(schema.fields[index].type));
        out.bytes(&values[index], sizeof(Scalar));
    }
    return out.take();
}

bool decode_state(const Schema& schema, const PluginFieldCollection* fc,
                  std::vector<Scalar>& values, std::string& error) {
    if (fc == nullptr || fc->nbFields != 1 || fc->fields == nullptr || fc->fields[0].name == nullptr ||
        std::strcmp(fc->fields[0].name, kStateFieldName) != 0)
        return fail(error, std::string("serialized plugin: expected exactly one field '") + kStateFieldName + "'");
    const PluginField& field = fc->fields[0];
    if (field.type != PluginFieldType::kUNKNOWN || field.length < 0 || (field.length > 0 && field.data == nullptr))
        return fail(error, "serialized plugin: malformed state field");

    ByteReader in(static_cast<const uint8_t*>(field.data), static_cast<size_t>(field.length));
    char magic[sizeof(kMagic)];
    uint32_t version = 0, name_length = 0, count = 0;
    if (!in.bytes(magic, sizeof(magic), "magic")) return fail(error, "serialized plugin: " + in.error());
    if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0)
        return fail(error, "serialized plugin: not a padfree plugin state (bad magic)");
    if (!in.u32(version, "format version")) return fail(error, "serialized plugin: " + in.error());
    if (version != kStateFormatVersion)
        return fail(error, concat("serialized plugin: state format version ", version, ", this library reads ",
                                  kStateFormatVersion, "; rebuild the engine with this plugin library"));
    if (!in.u32(name_length, "name length")) return fail(error, "serialized plugin: " + in.error());
    if (name_length > kMaxNameLength || name_length > in.left())
        return fail(error, "serialized plugin: truncated or corrupt plugin name");
    std::string name(name_length, '\0');
    in.bytes(&name[0], name_length, "name");
    if (name != schema.plugin_name)
        return fail(error, "serialized plugin: state of '" + name + "' handed to " + schema.plugin_name);
    if (!in.u32(count, "field count")) return fail(error, "serialized plugin: " + in.error());
    // The fields from `count` on must all have defaults (a blob from before they were added).
    size_t required = schema.fields.size();
    while (required > 0 && schema.fields[required - 1].has_default) --required;
    if (count > schema.fields.size() || count < required)
        return fail(error, concat("serialized plugin: ", count, " fields, ", schema.plugin_name, " has ",
                                  schema.fields.size(),
                                  required < schema.fields.size() ? concat(" (at least ", required, ")") : ""));
    values.assign(schema.fields.size(), Scalar{0});
    for (size_t index = count; index < schema.fields.size(); ++index) values[index] = schema.fields[index].default_value;
    for (size_t index = 0; index < count; ++index) {
        uint32_t type = 0;
        if (!in.u32(type, "field type") || !in.bytes(&values[index], sizeof(Scalar), "field value"))
            return fail(error, "serialized plugin: " + in.error());
        if (type != static_cast<uint32_t>(schema.fields[index].type))
            return fail(error, std::string("serialized plugin: field '") + schema.fields[index].name +
                                   "' has the wrong type");
    }
    if (in.left() != 0) return fail(error, concat("serialized plugin: ", in.left(), " unexpected trailing bytes"));
    return true;
}

}  // namespace trt
}  // namespace padfree
