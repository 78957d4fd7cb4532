#pragma once
// Reads the HTML reports and SVG charts back as XML (Boost.PropertyTree's parser), so tests
// check their structure rather than their text: a page that is not well-formed throws here.

#include <boost/property_tree/ptree.hpp>
#include <boost/property_tree/xml_parser.hpp>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace kvtier::testing {

using XmlTree = boost::property_tree::ptree;

inline XmlTree parse_xml(const std::string& text) {
  std::istringstream in(text);
  XmlTree tree;
  boost::property_tree::read_xml(in, tree);
  return tree;
}

// Every element named `name` below `tree`, in document order.
inline std::vector<const XmlTree*> elements(const XmlTree& tree, const std::string& name) {
  std::vector<const XmlTree*> found;
  const std::function<void(const XmlTree&)> walk = [&](const XmlTree& node) {
    for (const auto& [key, child] : node) {
      if (key == "<xmlattr>" || key == "<xmlcomment>") {
        continue;
      }
      if (key == name) {
        found.push_back(&child);
      }
      walk(child);
    }
  };
  walk(tree);
  return found;
}

inline std::string attribute(const XmlTree& element, const std::string& name) {
  return element.get<std::string>("<xmlattr>." + name, "");
}

inline double number_attribute(const XmlTree& element, const std::string& name) {
  return std::stod(attribute(element, name));
}

// The text of an element and of everything inside it.
inline std::string text_of(const XmlTree& element) {
  std::string text = element.data();
  for (const auto& [key, child] : element) {
    if (key != "<xmlattr>" && key != "<xmlcomment>") {
      text += text_of(child);
    }
  }
  return text;
}

// The texts of every element named `name` below `tree`, each followed by '|' and the first
// preceded by one ("|a|b|"), for checking that a run of them appears in order.
inline std::string joined_texts(const XmlTree& tree, const std::string& name) {
  std::string joined = "|";
  for (const XmlTree* element : elements(tree, name)) {
    joined += text_of(*element) + "|";
  }
  return joined;
}

}  // namespace kvtier::testing
