//! What the paper reports for its evaluation (section 6), for the report to set beside ours.
//! Its figures print no numbers, so these are the values its text states, per application
//! where it names one, and `None` where it names none; every one is approximate.

/// The paper's stated values for one application.
pub struct PaperApp {
    pub name: &'static str,
    /// Speedup of WIC over naive polling (Fig. 12a): "about 10%" for most, "exceeding 20%" for
    /// C_CG, C_FE and C_H3D, "surpassing 30%" for C_H3D; G_BFS and G_BS are the exceptions
    /// (G_BS "a slight decline"), with no figure given.
    pub speedup: Option<f64>,
    /// WIC's overlap efficiency (Fig. 14): "approximately 85%" for C_H3D and C_FE, "around 70%"
    /// for G_STN and G_KMN; the average exceeds 80%.
    pub overlap_wic: Option<f64>,
    /// Host-side overhead (Fig. 15): 3.6% G_STN, 3.4% G_GEM, 2.4% G_KMN; about 3% on average.
    pub host_overhead: Option<f64>,
}

const fn app(
    name: &'static str,
    speedup: Option<f64>,
    overlap_wic: Option<f64>,
    host_overhead: Option<f64>,
) -> PaperApp {
    PaperApp { name, speedup, overlap_wic, host_overhead }
}

/// The ten applications in the paper's order.
pub const APPS: [PaperApp; 10] = [
    app("C_SRS", Some(1.10), None, None),
    app("C_CG", Some(1.20), None, None),
    app("C_FE", Some(1.20), Some(0.85), None),
    app("C_H3D", Some(1.30), Some(0.85), None),
    app("G_BFS", None, None, None),
    app("G_BS", None, None, None),
    app("G_C2D", Some(1.10), None, None),
    app("G_STN", Some(1.10), Some(0.70), Some(0.036)),
    app("G_GEM", Some(1.10), None, Some(0.034)),
    app("G_KMN", Some(1.10), Some(0.70), Some(0.024)),
];

/// The paper's averages: speedup (abstract), naive and WIC overlap efficiency (§6.2), total
/// and host-side overhead (§6.3).
pub const MEAN_SPEEDUP: f64 = 1.13;
pub const NAIVE_OVERLAP: f64 = 0.10;
pub const WIC_OVERLAP: f64 = 0.80;
pub const TOTAL_OVERHEAD: f64 = 0.014;
pub const HOST_OVERHEAD: f64 = 0.03;

/// The paper's values for `name`, if it is one of its applications.
pub fn app_named(name: &str) -> Option<&'static PaperApp> {
    APPS.iter().find(|a| a.name == name)
}
